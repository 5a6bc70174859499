#!/bin/bash
# Beam 10 with the deep model against PyTorch eager (issue 48): scripts/torch_deep_reference.py's batched beam
# (100 sentences of torch_reference.py's decoding batch, their 10 hypotheses each as one batch of rows, every
# hypothesis run for 20 steps) alternated with `cgnmt bench --size small-deep`'s beam 10 (100 Hansards
# sentences in batches of 32, as `translate` decodes; finished hypotheses leave the batch), two threads each.
# The two decode different sentences for different lengths, so the comparison is per hypothesis step: decoder
# rows (a transition, attention, readout and output layer over the vocabulary) per second.
# Usage (repository root): EXE=path/to/cgnmt TORCH_PY=venv/bin/python bash results/layer-norm/torch-deep-beam/run.sh [ROUNDS]
set -euo pipefail
out=$(dirname "$0")
rounds=${1:-3}
: "${EXE:?EXE=path of the build}" "${TORCH_PY:?TORCH_PY=a python with torch}"
for r in $(seq 1 "$rounds"); do
  TORCH_THREADS=2 timeout 900 "$TORCH_PY" scripts/torch_deep_reference.py beam small-deep 3 > "$out/torch-$r.txt" 2>&1
  timeout 900 "$EXE" bench --size small-deep --steps 2 --decode-sentences 100 --repeats 3 --set train.threads=2 \
    2> "$out/cgnmt-$r.err" | tail -n 1 > "$out/cgnmt-$r.json"
  t=$(grep RESULT "$out/torch-$r.txt" | grep -o 'hyp_steps/s=[0-9.]*' | cut -d= -f2)
  c=$(python3 -c "import json; d = json.load(open('$out/cgnmt-$r.json')); print(round(d['decode_beam10_hyp_steps_per_s']), round(d['decode_beam10_sent_per_s'], 1))")
  set -- $c
  echo "round $r | torch $t | cgnmt $1 | ratio $(python3 -c "print(round($1 / $t, 2))") | cgnmt beam 10 sentences/s $2" | tee -a "$out/rounds.txt"
done
