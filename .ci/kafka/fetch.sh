#!/usr/bin/env bash
# Fetch the jars for a real Apache Kafka broker (see pom.xml beside this file)
# into $KAFKA_LIBS (default: ~/.cache/grandrounds/kafka-libs, outside the repo).
#
#   bash .ci/kafka/fetch.sh
#
# Idempotent: a marker file holding the sha256 of pom.xml is written last, after
# a successful copy; when it matches, nothing is done. Needs mvn and a JDK 17+.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
pom="$here/pom.xml"
KAFKA_LIBS="${KAFKA_LIBS:-$HOME/.cache/grandrounds/kafka-libs}"
marker="$KAFKA_LIBS/.complete"

die() { echo "fetch.sh: ERROR: $*" >&2; exit 1; }

want="$(sha256sum "$pom" | cut -d' ' -f1)"
if [[ -f "$marker" && "$(cat "$marker")" == "$want" ]]; then
  echo "fetch.sh: Kafka jars already in $KAFKA_LIBS"
  exit 0
fi

command -v mvn >/dev/null 2>&1 || die "mvn not found on PATH (apt-get install maven)"
command -v java >/dev/null 2>&1 || die "java not found on PATH (Kafka 4.x brokers need JDK 17+)"

# Copy into a scratch folder and move it into place only when complete, so an
# interrupted run never leaves a half-filled $KAFKA_LIBS that looks usable.
mkdir -p "$(dirname "$KAFKA_LIBS")"
tmp="$(mktemp -d "${KAFKA_LIBS}.tmp.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

echo "fetch.sh: resolving Kafka jars with Maven into $KAFKA_LIBS ..."
if ! mvn -q -B -f "$pom" dependency:copy-dependencies -DoutputDirectory="$tmp" -DincludeScope=runtime; then
  die "mvn dependency:copy-dependencies failed for $pom (is Maven Central reachable?)"
fi
ls "$tmp"/kafka_2.13-*.jar >/dev/null 2>&1 || die "kafka_2.13 jar missing from Maven output in $tmp"

echo "$want" > "$tmp/.complete"
rm -rf "$KAFKA_LIBS"
mv "$tmp" "$KAFKA_LIBS"
trap - EXIT
echo "fetch.sh: $(ls "$KAFKA_LIBS"/*.jar | wc -l) jars ($(du -sh "$KAFKA_LIBS" | cut -f1)) in $KAFKA_LIBS"
