#!/usr/bin/env bash
# Throughput scaling with workers on a 16-core machine, at P = 1, 2, 4, 8, 16:
#  1. in memory (examples/scaling.rs): one-phase vs two-phase on 10M generated rows with a hot
#     key, uniform keys and high-cardinality keys, on the ordered and the pipelined runtime;
#  2. from Parquet (`tally bench`, the pipelined runtime): orders-count on 10M orders (also with
#     mini-batches of 32768, and over a changelog of 10M rows: chunks applied in input order)
#     and orders-distinct (split off and on), q15, q17 on 10M bids and q16 at P = 4 and 16,
#     against DuckDB with as many threads (`--duckdb`, when DuckDB's Python package is
#     installed: scripts/install-duckdb.sh);
#  3. Nexmark q15/q16 in memory with split-distinct off and on (examples/nexmark.rs).
#
# Build here, then run where the cores are:
#   cargo build --release --bin tally --example scaling --example nexmark
#   scripts/scaling-16.sh [DIR] [OUT.md]
# DIR holds the tally binary and the two example binaries (default target/release: the examples
# in DIR/examples); the tables go to OUT.md (default scaling-16.md) and standard output.
# BENCHMARKS.md's "16 cores" sections take them.
set -euo pipefail
dir="${1:-target/release}"
out="${2:-scaling-16.md}"
tally="$dir/tally"
examples="$dir/examples"
[[ -x "$examples/scaling" ]] || examples="$dir"
for b in "$tally" "$examples/scaling" "$examples/nexmark"; do
  if [[ ! -x "$b" ]]; then
    echo "error: $b is not an executable (cargo build --release --bin tally --example scaling --example nexmark)" >&2
    exit 1
  fi
done
data="${TMPDIR:-/tmp}/tally-scaling"
mkdir -p "$data"
[[ -f "$data/orders-10m.parquet" ]] || "$tally" gen orders --rows 10000000 --out "$data/orders-10m.parquet" >&2
[[ -f "$data/bid-10m.parquet" ]] || "$tally" gen nexmark --events 10000000 --out "$data/bid-10m.parquet" >&2
[[ -f "$data/orders-changelog-10m.parquet" ]] || "$tally" gen orders --rows 10000000 --updates 0.2 \
  --out "$data/orders-changelog-10m.parquet" >&2
duckdb=()
if python3 -c "import duckdb" 2>/dev/null; then duckdb=(--duckdb); fi
{
  echo "# scaling on $(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  lscpu 2>/dev/null | grep -E '^(Model name|Socket|Core|Thread)' | sed 's/^/    /' || true
  echo
  "$examples/scaling" --rows 10000000 --workers 1,2,4,8,16 --repeat 3 \
    --datasets hot,uniform,high-card --strategies one-phase,two-phase --runtimes ordered,pipelined
  echo
  "$tally" bench --query orders-count --input "$data/orders-10m.parquet" --matrix one-phase,two-phase \
    --workers 1,2,4,8,16 --repeat 3 "${duckdb[@]}"
  echo
  "$tally" bench --query orders-count --input "$data/orders-10m.parquet" --matrix two-phase \
    --workers 1,2,4,8,16 --repeat 3 --mini-batch 32768
  echo
  "$tally" bench --query orders-count --input "$data/orders-changelog-10m.parquet" --matrix two-phase \
    --workers 1,2,4,8,16 --repeat 3
  echo
  "$tally" bench --query orders-distinct --input "$data/orders-10m.parquet" --matrix two-phase,split,split-auto \
    --workers 1,2,4,8,16 --repeat 1 "${duckdb[@]}"
  echo
  "$tally" bench --query q16 --input "$data/bid-10m.parquet" --matrix two-phase \
    --workers 4,16 --repeat 1 "${duckdb[@]}"
  echo
  "$tally" bench --query q15 --input "$data/bid-10m.parquet" --matrix split,split-auto \
    --workers 4,16 --repeat 1
  echo
  for q in q15 q17; do
    "$tally" bench --query "$q" --input "$data/bid-10m.parquet" --matrix two-phase \
      --workers 1,2,4,8,16 --repeat 1 "${duckdb[@]}"
    echo
  done
  "$examples/nexmark" --events 10000000 --workers 1,2,4,8,16 --repeat 1 --dir "$data/nexmark"
} | tee "$out"
