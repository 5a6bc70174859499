#!/bin/bash
# The layer-normalised model's speed (issue 48): `cgnmt bench --size small` of the plain model (fused kernels),
# of the same model with `model.layer_norm = true` asked for fused kernels (the fused row ops inside the composed
# recurrence) and with `--kernels reference` (composed ops throughout), alternated, the same build, two threads
# each. One JSON and one stderr file per run.
# Usage (repository root): EXE=path/to/cgnmt bash results/layer-norm/bench/run.sh [ROUNDS]
set -euo pipefail
out=$(dirname "$0")
rounds=${1:-3}
: "${EXE:?EXE=path of the build}"
for r in $(seq 1 "$rounds"); do
  for v in plain ln ln-reference; do
    case $v in
      plain) args=() ;;
      ln) args=(--set model.layer_norm=true) ;;
      ln-reference) args=(--set model.layer_norm=true --kernels reference) ;;
    esac
    timeout 1200 "$EXE" bench --size small --steps 5 --decode-sentences 100 --repeats 2 --set train.threads=2 \
      "${args[@]}" 2> "$out/$v-$r.err" | tail -n 1 > "$out/$v-$r.json"
  done
  echo "round $r done"
done
