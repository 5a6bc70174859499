#!/usr/bin/env bash
# Training throughput side by side with ../shared/bench/torch_reference.py on its own batch, alternated, one
# line per round (target tokens/s of each and their ratio).
# Usage: TORCH_PY=venv/bin/python scripts/train_vs_torch.sh small|paper [ROUNDS]
#   TORCH_PY  a python with torch and safetensors (see ../shared/bench/README.md)
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE=${1:-small}
ROUNDS=${2:-5}
BIN=${BIN:-./target/release/cgnmt}
BENCH=${BENCH_DIR:-../shared/bench}
case $SIZE in small) TSTEPS=7; CSTEPS=8 ;; paper) TSTEPS=4; CSTEPS=4 ;; *) echo "size: small or paper" >&2; exit 2 ;; esac
for r in $(seq 1 "$ROUNDS"); do
  t=$(cd "$BENCH" && TORCH_THREADS=2 "${TORCH_PY:?}" torch_reference.py train "$SIZE" "$TSTEPS" 2>&1 \
    | grep RESULT | grep -o ' tok/s=[0-9.]*' | cut -d= -f2)
  c=$($BIN bench --size "$SIZE" --lengths reference --steps "$CSTEPS" --decode-sentences 10 --repeats 1 2>/dev/null \
    | tail -1 | python3 -c "import json, sys; print(round(json.load(sys.stdin)['train_tgt_tok_per_s'], 1))")
  echo "round $r | torch $t | cgnmt $c | ratio $(python3 -c "print(round($c / $t, 2))")"
done
