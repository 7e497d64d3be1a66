#!/usr/bin/env bash
# A model of a run on 16 cores from a machine with fewer: each thread's CPU time at P = 1 and
# P = 16, sampled with `perf record -e cpu-clock`. On 16 cores a run takes at least its busiest
# task thread (a source or keyed task, or a pool worker) and at least its task threads' total
# over 16; the model is the larger. The caller's thread (planning, opening the input, the stages
# after the aggregate) is printed apart: most of it falls outside the timed run.
#
#   scripts/clock-model.sh TALLY DATA_DIR [QUERY:INPUT:STRATEGY ...]
# TALLY: the release binary; DATA_DIR holds INPUT.parquet (`tally gen`). Prints, per query and
# P, samples (at 2,999 a second) on the caller's thread and the tasks', the busiest task, and
# the model. Needs perf and python3.
set -euo pipefail
tally="$(realpath "$1")"
data="$2"
shift 2
specs=("$@")
if [ ${#specs[@]} -eq 0 ]; then
  specs=(orders-count:orders-10m:two-phase orders-distinct:orders-10m:two-phase
    orders-distinct:orders-10m:split q15:bid-10m:two-phase q15:bid-10m:split
    q16:bid-2m:two-phase q16:bid-2m:split q17:bid-10m:two-phase)
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cd "$data"
for spec in "${specs[@]}"; do
  IFS=: read -r query input strategy <<<"$spec"
  for p in 1 16; do
    perf record -q -e cpu-clock -F 2999 -o "$tmp/perf.data" "$tally" bench --query "$query" \
      --input "$input.parquet" --matrix "$strategy" --workers "$p" --repeat 1 >/dev/null 2>&1
    perf script -i "$tmp/perf.data" -F comm,tid 2>/dev/null | python3 -c "
import collections, sys
samples = collections.Counter(); name = {}
for line in sys.stdin:
    f = line.split()
    if len(f) >= 2:
        samples[f[-1]] += 1; name[f[-1]] = ' '.join(f[:-1])
task = lambda t: name[t].startswith(('tally-source', 'tally-worker'))
caller = sum(n for t, n in samples.items() if not task(t))
tasks = [n for t, n in samples.items() if task(t)]
busiest, total = max(tasks), sum(tasks)
print(f'$query $input $strategy P=$p caller {caller} tasks {total} busiest {busiest} model {max(busiest, total / 16):.0f}')
"
  done
done
