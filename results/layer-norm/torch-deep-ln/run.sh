#!/bin/bash
# The layer-normalised deep model's training against PyTorch eager, op for op (issue 48):
# `scripts/torch_deep_reference.py train small-deep-ln` on the batch of ../shared/bench/torch_reference.py,
# alternated with `cgnmt bench --size small-deep --lengths reference --set model.layer_norm=true` (the same
# padded batch, so the target tokens/s compare directly), two threads each. One line per
# round into rounds.txt; each program's last lines beside it.
# With OLD=path/to/another/cgnmt each round also runs that build (old-N.json, old-N.err), and the rounds' line
# gives its rate and share too. OUT=folder writes there instead of beside this script.
# SIZE=paper runs the paper's size (`paper-deep-ln` against `--size paper-deep`) instead of the small one; STEPS
# sets the steps of each program (default 8: PyTorch's first is its warm-up and is left out, so it runs 7).
# Usage (repository root): EXE=path/to/cgnmt TORCH_PY=venv/bin/python [OLD=…] [OUT=…] [SIZE=…] [STEPS=…] bash results/layer-norm/torch-deep-ln/run.sh [ROUNDS]
set -euo pipefail
out=${OUT:-$(dirname "$0")}
mkdir -p "$out"
rounds=${1:-3}
size=${SIZE:-small}
steps=${STEPS:-8}
: "${EXE:?EXE=path of the build}" "${TORCH_PY:?TORCH_PY=a python with torch}"
for r in $(seq 1 "$rounds"); do
  TORCH_THREADS=2 timeout 900 "$TORCH_PY" scripts/torch_deep_reference.py train "$size-deep-ln" "$((steps - 1))" > "$out/torch-$r.txt" 2>&1
  timeout 900 "$EXE" bench --size "$size-deep" --lengths reference --steps "$steps" --decode-sentences 10 --repeats 1 \
    --set train.threads=2 --set model.layer_norm=true 2> "$out/cgnmt-$r.err" | tail -n 1 > "$out/cgnmt-$r.json"
  old=""
  if [ -n "${OLD:-}" ]; then
    timeout 900 "$OLD" bench --size "$size-deep" --lengths reference --steps "$steps" --decode-sentences 10 --repeats 1 \
      --set train.threads=2 --set model.layer_norm=true 2> "$out/old-$r.err" | tail -n 1 > "$out/old-$r.json"
    old=$(python3 -c "import json; d = json.load(open('$out/old-$r.json')); print(' | old', round(d['train_tgt_tok_per_s'], 1), 'share', round(d['peak_fraction_between_steps'], 3))")
  fi
  t=$(grep RESULT "$out/torch-$r.txt" | grep -o ' tok/s=[0-9.]*' | cut -d= -f2)
  c=$(python3 -c "import json; d = json.load(open('$out/cgnmt-$r.json')); print(round(d['train_tgt_tok_per_s'], 1), round(d['peak_fraction_between_steps'], 3))")
  set -- $c
  echo "round $r | torch $t | cgnmt $1 | ratio $(python3 -c "print(round($1 / $t, 2))") | cgnmt share of the SGEMM peak between steps $2$old" | tee -a "$out/rounds.txt"
done
