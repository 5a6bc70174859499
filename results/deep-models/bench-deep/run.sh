#!/bin/bash
# The deep model's speed: `cgnmt bench --size small-deep` (2 encoder layers, a depth-2 transition) alternated
# with `--size small` (one layer), the same build, two threads each. One JSON and one stderr file per run.
# Usage (repository root): EXE=path/to/cgnmt bash results/deep-models/bench-deep/run.sh [ROUNDS]
set -euo pipefail
out=$(dirname "$0")
rounds=${1:-3}
: "${EXE:?EXE=path of the build}"
for r in $(seq 1 "$rounds"); do
  for size in small small-deep; do
    timeout 900 "$EXE" bench --size "$size" --steps 9 --decode-sentences 100 --repeats 3 --set train.threads=2 \
      2> "$out/$size-$r.err" | tail -n 1 > "$out/$size-$r.json"
  done
  echo "round $r done"
done
