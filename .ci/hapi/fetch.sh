#!/usr/bin/env bash
# Fetch the jars of a real HAPI FHIR JPA server (HAPI FHIR 8.0.0, see pom.xml) into $HAPI_LIBS
# (default ~/.cache/grandrounds/hapi-libs, outside the repo): plain HTTPS downloads from Maven
# Central of the set in hapi-jars.txt, sha1-checked (fetch.py; no Maven needed). ~340 jars, 280 MB.
set -euo pipefail
exec "${PYTHON:-python3}" "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/fetch.py"
