#!/bin/bash
# The layer-normalised model with the fused encoder and decoder ops that normalise inside (issue 48), with the cGRU decoder (Nematus's), against
# the same model before them (OLD: the fused row ops in the composed recurrence) and the plain model, alternated:
# `cgnmt bench --size small`, two threads each. One JSON and one stderr file per run.
# Usage (repository root): OLD=path/to/old NEW=path/to/new bash results/layer-norm/fused-ops-cgru/run.sh [ROUNDS]
set -euo pipefail
out=$(dirname "$0")
rounds=${1:-3}
: "${OLD:?OLD=path of the build before}" "${NEW:?NEW=path of the build after}"
for r in $(seq 1 "$rounds"); do
  for v in plain ln-before ln; do
    case $v in
      plain) exe=$NEW; args=(--set model.decoder=cgru) ;;
      ln-before) exe=$OLD; args=(--set model.decoder=cgru --set model.layer_norm=true) ;;
      ln) exe=$NEW; args=(--set model.decoder=cgru --set model.layer_norm=true) ;;
    esac
    timeout 1200 "$exe" bench --size small --steps 5 --decode-sentences 100 --repeats 2 --set train.threads=2 \
      "${args[@]}" 2> "$out/$v-$r.err" | tail -n 1 > "$out/$v-$r.json"
  done
  echo "round $r done"
done
