#!/usr/bin/env bash
# Builds the Flink operator (the JNI library in flink/ and its Java classes) and runs its tests
# in a local Flink MiniCluster: each checks the Tally operator against Flink's own SQL. Ends with
# a plain "N passed, M failed" line.
#
#   scripts/flink-test.sh [CASE]        # CASE: run only the cases whose name contains it
#
# Needs Java 17 (javac) and Python's pip for scripts/install-flink.sh; builds in debug unless
# TALLY_FLINK_PROFILE=release.
set -euo pipefail
cd "$(dirname "$0")/.."

lib=$(scripts/install-flink.sh)
profile="${TALLY_FLINK_PROFILE:-debug}"
if [ "$profile" = release ]; then
  cargo build --locked --release -p tally-flink
else
  cargo build --locked -p tally-flink
fi
native="$PWD/target/$profile/libtally_flink.so"

out=target/flink
rm -rf "$out/classes" "$out/test-classes"
mkdir -p "$out/classes" "$out/test-classes"
cp="$lib/*"
javac -nowarn -Xlint:none -d "$out/classes" -cp "$cp" $(find flink/java -name '*.java')
javac -nowarn -Xlint:none -d "$out/test-classes" -cp "$out/classes:$cp" $(find flink/test -name '*.java')
(cd "$out/classes" && jar --create --file ../tally-flink.jar org)

# Flink on Java 17 reflects into these packages (Flink's own launch scripts open the same).
opens=()
for p in java.base/java.lang java.base/java.util java.base/java.lang.reflect java.base/java.io \
         java.base/java.nio java.base/sun.nio.ch java.base/java.net java.base/java.text \
         java.base/java.time java.base/java.util.concurrent java.base/java.util.concurrent.atomic; do
  opens+=("--add-opens=$p=ALL-UNNAMED")
done

java "${opens[@]}" -Xmx1g \
  -Dtally.flink.library="$native" \
  -Dlog4j.configurationFile="$PWD/flink/log4j2.properties" \
  -cp "$out/tally-flink.jar:$out/test-classes:$cp" \
  org.tally.flink.FlinkTests "$@"
