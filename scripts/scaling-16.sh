#!/usr/bin/env bash
# Throughput scaling with workers on a 16-core machine: one-phase vs two-phase (adaptive local
# phase on and off) on 10M generated rows with a hot key, uniform keys and high-cardinality keys.
#
# Build here, then run the binary where the cores are:
#   cargo build --release --example scaling
#   scripts/scaling-16.sh [BINARY] [OUT.md]
# BINARY defaults to target/release/examples/scaling, OUT.md to scaling-16.md. The table goes to
# OUT.md and standard output; BENCHMARKS.md's "16 cores" section is that table.
set -euo pipefail
bin="${1:-target/release/examples/scaling}"
out="${2:-scaling-16.md}"
if [[ ! -x "$bin" ]]; then
  echo "error: $bin is not an executable (cargo build --release --example scaling)" >&2
  exit 1
fi
{
  echo "# scaling on $(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  lscpu 2>/dev/null | grep -E '^(Model name|Socket|Core|Thread)' | sed 's/^/    /' || true
  echo
  "$bin" --rows 10000000 --workers 1,2,4,8,16 --repeat 3 \
    --datasets hot,uniform,high-card --strategies one-phase,two-phase,two-phase-fixed
} | tee "$out"
