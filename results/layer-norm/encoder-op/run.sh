#!/bin/bash
# The layer-normalised model before and after its encoder runs the fused op that normalises inside (issue 48):
# `cgnmt bench --size small` with `model.layer_norm = true`, fused kernels asked for, the build before (OLD) and
# after (NEW), alternated, two threads each. One JSON and one stderr file per run.
# Usage (repository root): OLD=path/to/old NEW=path/to/new bash results/layer-norm/encoder-op/run.sh [ROUNDS]
set -euo pipefail
out=$(dirname "$0")
rounds=${1:-3}
: "${OLD:?OLD=path of the build before}" "${NEW:?NEW=path of the build after}"
for r in $(seq 1 "$rounds"); do
  for v in old new; do
    exe=$OLD
    [ "$v" = new ] && exe=$NEW
    timeout 1200 "$exe" bench --size small --steps 5 --decode-sentences 100 --repeats 2 --set train.threads=2 \
      --set model.layer_norm=true 2> "$out/$v-$r.err" | tail -n 1 > "$out/$v-$r.json"
  done
  echo "round $r done"
done
