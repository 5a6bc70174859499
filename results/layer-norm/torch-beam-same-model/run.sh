#!/bin/bash
# Beam 10 over the same model in cgnmt and in PyTorch eager (issue 48): the deep GRU with the context gate on
# both sides that configs/reproduce/deep.toml trains (two encoder layers, a depth-2 transition; seed 1, its
# best checkpoint), decoding the Tatoeba zh-en test set (2,049 sentences) in batches of 32, two threads each. cgnmt runs
# `translate` (its rate covers tokenisation, subwords and writing the output too); the PyTorch side runs
# scripts/torch_beam_same_model.py, the same search written in torch ops, over the source ids of cgnmt's
# `--dump` (written once, first), and checks that its translations are cgnmt's. One line per round into
# rounds.txt; each program's last lines beside it.
# Usage (repository root): EXE=path/to/cgnmt TORCH_PY=venv/bin/python bash results/layer-norm/torch-beam-same-model/run.sh [ROUNDS]
set -euo pipefail
out=$(dirname "$0")
rounds=${1:-5}
: "${EXE:?EXE=path of the build}" "${TORCH_PY:?TORCH_PY=a python with torch}"
model=${MODEL:-results/deep/systems/deep-gru-both/seed-1/run/best}
src=${CGNMT_DATA:-../shared/data}/tatoeba-zh-en/test.zh
dump=${TMPDIR:-/tmp}/torch-beam-same-model.dump.jsonl
echo "model: $model" > "$out/model.txt"
timeout 900 "$EXE" translate -m "$model" --quiet --dump "$dump" < "$src" > "$out/cgnmt-translations.txt"
for r in $(seq 1 "$rounds"); do
  timeout 900 "$EXE" translate -m "$model" < "$src" 2> "$out/cgnmt-$r.err" > /dev/null
  TORCH_THREADS=2 timeout 1800 "$TORCH_PY" scripts/torch_beam_same_model.py "$model" "$dump" 1 32 > "$out/torch-$r.txt" 2>&1
  c=$(grep -o '([0-9.]* sentences/s' "$out/cgnmt-$r.err" | grep -o '[0-9.]*')
  t=$(grep RESULT "$out/torch-$r.txt" | grep -o 'sent/s=[0-9.]*' | cut -d= -f2)
  same=$(grep RESULT "$out/torch-$r.txt" | grep -o 'same=[0-9]*' | cut -d= -f2)
  echo "round $r | torch $t | cgnmt $c | ratio $(python3 -c "print(round($c / $t, 2))") | same translations $same" | tee -a "$out/rounds.txt"
done
