#!/usr/bin/env bash
# The Tally operator against Flink's own SQL in one MiniCluster (flink/bench/FlinkBench.java):
# release build, the same generated input for both, medians of REPEAT runs each.
#
#   scripts/flink-bench.sh WORKLOAD ROWS PARALLELISM REPEAT [ENGINES]   # orders-count | q15 | q17
set -euo pipefail
cd "$(dirname "$0")/.."
export TALLY_FLINK_PROFILE=release
source scripts/flink-env.sh

run_java 4g org.tally.flink.FlinkBench "$@"
