#!/bin/bash
# The deep model's training against PyTorch eager, op for op (issue 48): scripts/torch_deep_reference.py on the
# batch of ../shared/bench/torch_reference.py, alternated with `cgnmt bench --size small-deep --lengths
# reference` (the same padded batch, so the target tokens/s compare directly), two threads each. One line per
# round into rounds.txt; each program's last lines beside it.
# OUT=folder writes there instead of beside this script.
# Usage (repository root): EXE=path/to/cgnmt TORCH_PY=venv/bin/python [OUT=…] bash results/layer-norm/torch-deep/run.sh [ROUNDS]
set -euo pipefail
out=${OUT:-$(dirname "$0")}
mkdir -p "$out"
rounds=${1:-3}
: "${EXE:?EXE=path of the build}" "${TORCH_PY:?TORCH_PY=a python with torch}"
for r in $(seq 1 "$rounds"); do
  TORCH_THREADS=2 timeout 900 "$TORCH_PY" scripts/torch_deep_reference.py train small-deep 7 > "$out/torch-$r.txt" 2>&1
  timeout 900 "$EXE" bench --size small-deep --lengths reference --steps 8 --decode-sentences 10 --repeats 1 \
    --set train.threads=2 2> "$out/cgnmt-$r.err" | tail -n 1 > "$out/cgnmt-$r.json"
  t=$(grep RESULT "$out/torch-$r.txt" | grep -o ' tok/s=[0-9.]*' | cut -d= -f2)
  c=$(python3 -c "import json; d = json.load(open('$out/cgnmt-$r.json')); print(round(d['train_tgt_tok_per_s'], 1), round(d['peak_fraction_between_steps'], 3))")
  set -- $c
  echo "round $r | torch $t | cgnmt $1 | ratio $(python3 -c "print(round($1 / $t, 2))") | cgnmt share of the SGEMM peak between steps $2" | tee -a "$out/rounds.txt"
done
