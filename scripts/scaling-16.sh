#!/usr/bin/env bash
# Throughput scaling with workers on a 16-core machine:
#  1. one-phase vs two-phase (adaptive local phase on and off) on 10M generated rows with a hot
#     key, uniform keys and high-cardinality keys (examples/scaling.rs);
#  2. Nexmark q15/q16 on 10M bid events with split-distinct off and on (examples/nexmark.rs).
#
# Build here, then run where the cores are:
#   cargo build --release --example scaling --example nexmark
#   scripts/scaling-16.sh [DIR] [OUT.md]
# DIR holds the two example binaries (default target/release/examples); the tables go to OUT.md
# (default scaling-16.md) and standard output. BENCHMARKS.md's "16 cores" sections take them.
set -euo pipefail
dir="${1:-target/release/examples}"
out="${2:-scaling-16.md}"
for b in scaling nexmark; do
  if [[ ! -x "$dir/$b" ]]; then
    echo "error: $dir/$b is not an executable (cargo build --release --example $b)" >&2
    exit 1
  fi
done
{
  echo "# scaling on $(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  lscpu 2>/dev/null | grep -E '^(Model name|Socket|Core|Thread)' | sed 's/^/    /' || true
  echo
  "$dir/scaling" --rows 10000000 --workers 1,2,4,8,16 --repeat 3 \
    --datasets hot,uniform,high-card --strategies one-phase,two-phase,two-phase-fixed
  echo
  "$dir/nexmark" --events 10000000 --workers 1,2,4,8,16 --repeat 3 --dir "${TMPDIR:-/tmp}/tally-nexmark"
} | tee "$out"
