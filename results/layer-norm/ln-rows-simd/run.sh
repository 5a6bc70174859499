#!/bin/bash
# The layer norm rows' sums in lanes, run with the CPU's vector instructions (issue 48), against the build
# before: `cgnmt bench --size small-deep --lengths reference --set model.layer_norm=true`, alternated, two
# threads each. One JSON and one stderr file per run; `python3 summarise.py` (this folder) summarises.
# OUT=folder writes there instead of beside this script.
# Usage (repository root): OLD=path/to/old NEW=path/to/new [OUT=…] bash results/layer-norm/ln-rows-simd/run.sh [ROUNDS]
set -euo pipefail
out=${OUT:-$(dirname "$0")}
mkdir -p "$out"
rounds=${1:-5}
: "${OLD:?OLD=path of the build before}" "${NEW:?NEW=path of the build after}"
for r in $(seq 1 "$rounds"); do
  for v in old new; do
    exe=$OLD; [ "$v" = new ] && exe=$NEW
    timeout 900 "$exe" bench --size small-deep --lengths reference --steps 8 --decode-sentences 10 --repeats 1 \
      --set train.threads=2 --set model.layer_norm=true 2> "$out/$v-$r.err" | tail -n 1 > "$out/$v-$r.json"
  done
  echo "round $r done"
done
