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

source scripts/flink-env.sh

run_java 1g org.tally.flink.FlinkTests "$@"
