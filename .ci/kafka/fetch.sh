#!/usr/bin/env bash
# Fetch the jars for a real Apache Kafka broker into $KAFKA_LIBS (default:
# ~/.cache/grandrounds/kafka-libs, outside the repo), WITHOUT Maven: plain HTTPS downloads from
# Maven Central of the set listed in grandrounds/kafka_dev/kafka-jars.txt (the runtime set Maven
# resolves for pom.xml beside this file), each checked against the listed sha1 and Central's .sha1.
# The same code as `grandrounds kafka fetch` / `grandrounds kafka dev`; standard library only, so it
# runs from a clone before anything is installed.
#
#   bash .ci/kafka/fetch.sh
#
# Idempotent: a `.complete` marker (the sha256 of pom.xml, recorded in the jar list) is written last, after a complete,
# checked folder has been renamed into place; when it matches, nothing is downloaded.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
command -v java >/dev/null 2>&1 || echo "fetch.sh: note: java not found on PATH (Kafka 4.x brokers need JDK 17+)" >&2
PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" exec "${PYTHON:-python3}" -m grandrounds.kafka_dev.jars
