#!/bin/bash
# Layer-normalised decoding with the gate's mix fused (issue 48): the decoding step's transition reads the fused
# mix of the word and context terms and the normalised recurrent products, against the build before (OLD: the
# gate's scales applied term by term) and the plain model, alternated: `cgnmt bench --size small` (the both
# gate), two threads each. One JSON and one stderr file per run; `python3 ../fused-ops/summarise.py FOLDER`.
# Usage (repository root): OLD=path/to/old NEW=path/to/new bash results/layer-norm/decode-mix/run.sh [ROUNDS]
set -euo pipefail
out=$(dirname "$0")
rounds=${1:-3}
: "${OLD:?OLD=path of the build before}" "${NEW:?NEW=path of the build after}"
for r in $(seq 1 "$rounds"); do
  for v in plain ln-before ln; do
    case $v in
      plain) exe=$NEW; args=() ;;
      ln-before) exe=$OLD; args=(--set model.layer_norm=true) ;;
      ln) exe=$NEW; args=(--set model.layer_norm=true) ;;
    esac
    timeout 1200 "$exe" bench --size small --steps 5 --decode-sentences 100 --repeats 2 --set train.threads=2 \
      "${args[@]}" 2> "$out/$v-$r.err" | tail -n 1 > "$out/$v-$r.json"
  done
  echo "round $r done"
done
