# Sourced by scripts/flink-test.sh, flink-bench.sh and flink-example.sh: installs Flink's jars, builds
# the JNI library (debug, or release with TALLY_FLINK_PROFILE=release) and the Java classes
# (the operator in target/flink/tally-flink.jar, the tests and benchmarks beside it), and sets
# $lib (the jars), $native (the library), $out and $opens (the JVM's flags), and run_java.
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
javac -nowarn -Xlint:none -d "$out/test-classes" -cp "$out/classes:$cp" $(find flink/test flink/bench flink/examples -name '*.java')
(cd "$out/classes" && jar --create --file ../tally-flink.jar org)

# Flink on Java 17 reflects into these packages (Flink's own launch scripts open the same).
opens=()
for p in java.base/java.lang java.base/java.util java.base/java.lang.reflect java.base/java.io \
         java.base/java.nio java.base/sun.nio.ch java.base/java.net java.base/java.text \
         java.base/java.time java.base/java.util.concurrent java.base/java.util.concurrent.atomic; do
  opens+=("--add-opens=$p=ALL-UNNAMED")
done

# Runs a Java main class of the operator's classes with Flink's jars: run_java HEAP CLASS ARGS...
run_java() {
  local heap=$1 main=$2
  shift 2
  java "${opens[@]}" "-Xmx$heap" \
    -Dtally.flink.library="$native" \
    -Dlog4j.configurationFile="$PWD/flink/log4j2.properties" \
    -cp "$out/tally-flink.jar:$out/test-classes:$lib/*" \
    "$main" "$@"
}
