#!/bin/bash
# The layer-normalised model with the fused decoder op normalising inside for the vanilla unit and the paper gate
# form (issue 48), against the same model before (OLD: the fused row ops in the composed recurrence) and the
# plain model, alternated: `cgnmt bench --size small` (the both gate), two threads each. One folder per decoder,
# one JSON and one stderr file per run; `python3 ../fused-ops/summarise.py FOLDER` summarises a folder.
# Usage (repository root): OLD=path/to/old NEW=path/to/new bash results/layer-norm/fused-ops-vanilla-paper/run.sh [ROUNDS]
set -euo pipefail
here=$(dirname "$0")
rounds=${1:-3}
: "${OLD:?OLD=path of the build before}" "${NEW:?NEW=path of the build after}"
for r in $(seq 1 "$rounds"); do
  for dec in vanilla gru-paper; do
    case $dec in
      vanilla) base=(--set model.decoder=vanilla) ;;
      gru-paper) base=(--set model.gate_form=paper) ;;
    esac
    out=$here/$dec
    mkdir -p "$out"
    for v in plain ln-before ln; do
      case $v in
        plain) exe=$NEW; args=("${base[@]}") ;;
        ln-before) exe=$OLD; args=("${base[@]}" --set model.layer_norm=true) ;;
        ln) exe=$NEW; args=("${base[@]}" --set model.layer_norm=true) ;;
      esac
      timeout 1200 "$exe" bench --size small --steps 5 --decode-sentences 100 --repeats 2 --set train.threads=2 \
        "${args[@]}" 2> "$out/$v-$r.err" | tail -n 1 > "$out/$v-$r.json"
    done
  done
  echo "round $r done"
done
