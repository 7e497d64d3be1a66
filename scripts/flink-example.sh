#!/usr/bin/env bash
# Runs the example Flink job whose GROUP BY runs in Tally (flink/examples/ShopTotals.java) in a
# local MiniCluster: release build of the JNI library, Flink 2.3.0's jars from
# scripts/install-flink.sh.
#
#   scripts/flink-example.sh [ROWS]
set -euo pipefail
cd "$(dirname "$0")/.."
export TALLY_FLINK_PROFILE=release
source scripts/flink-env.sh

run_java 2g org.tally.flink.examples.ShopTotals "$@"
