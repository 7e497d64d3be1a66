#!/usr/bin/env bash
# Side-by-side `tally bench` of two binaries on a noisy machine: runs them alternately ROUNDS
# times with the same arguments (A, B, A, B, …) and prints, per configuration (strategy,
# workers), each round's M rows/s and the median over the rounds, for A and for B, and B / A.
#
#   scripts/ab-bench.sh BIN_A BIN_B ROUNDS bench --query orders-count --input F --workers 1,2 …
#
# Never needed by the tests or CI.
set -euo pipefail
if [[ $# -lt 4 ]]; then
  echo "usage: $0 BIN_A BIN_B ROUNDS bench ARGS…" >&2
  exit 2
fi
a="$1"
b="$2"
rounds="$3"
shift 3
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for ((r = 0; r < rounds; r++)); do
  "$a" "$@" >"$out/a.$r" 2>/dev/null
  "$b" "$@" >"$out/b.$r" 2>/dev/null
done
python3 - "$out" "$rounds" <<'EOF'
import statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])

def rates(path):
    rows = {}
    for line in open(path):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) > 3 and cells[1].isdigit():
            rows[(cells[0], int(cells[1]))] = float(cells[2])
    return rows

runs = {side: [rates(f"{out}/{side}.{r}") for r in range(rounds)] for side in "ab"}
print("| strategy | workers | A rounds (M rows/s) | B rounds | A median | B median | B / A |")
print("|---|---:|---|---|---:|---:|---:|")
for key in runs["a"][0]:
    a = [run[key] for run in runs["a"] if key in run]
    b = [run[key] for run in runs["b"] if key in run]
    ma, mb = statistics.median(a), statistics.median(b)
    fmt = lambda xs: " ".join(f"{x:.1f}" for x in xs)
    print(f"| {key[0]} | {key[1]} | {fmt(a)} | {fmt(b)} | {ma:.2f} | {mb:.2f} | {mb / ma:.2f} |")
EOF
