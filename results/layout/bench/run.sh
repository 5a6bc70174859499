#!/bin/bash
# Does the layout move (issue 39: folders by role, kernels apart, the long functions split) change the speed?
# `cgnmt bench --size small` with the build from before the move (OLD) and after it (NEW), alternated
# (OLD NEW OLD NEW ...), two threads each, nothing else running. Writes one JSON and one stderr file per run;
# scripts/bench_summary.py turns them into the table of README.md.
# Usage (repository root): OLD=path/to/old/cgnmt NEW=path/to/new/cgnmt bash results/layout/bench/run.sh [ROUNDS]
set -euo pipefail
out=$(dirname "$0")
rounds=${1:-7}
: "${OLD:?OLD=path of the build before the move}" "${NEW:?NEW=path of the build after it}"
for r in $(seq 1 "$rounds"); do
  for side in old new; do
    exe=$OLD; [ $side = new ] && exe=$NEW
    timeout 900 "$exe" bench --size small --steps 9 --decode-sentences 100 --repeats 3 --set train.threads=2 \
      2> "$out/$side-$r.err" | tail -n 1 > "$out/$side-$r.json"
  done
  echo "round $r done"
done
