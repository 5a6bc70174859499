#!/bin/bash
# The layer-normalised model with the fused encoder and decoder ops that normalise inside (issue 48), against
# the same model before them (OLD: the fused row ops in the composed recurrence) and the plain model, alternated:
# `cgnmt bench --size small`, two threads each. One JSON and one stderr file per run.
# Other folders run it too: OUT=folder writes there, SETS="key=value …" adds those settings to every run.
# Usage (repository root): OLD=path/to/old NEW=path/to/new [OUT=…] [SETS=…] bash results/layer-norm/fused-ops/run.sh [ROUNDS]
set -euo pipefail
out=${OUT:-$(dirname "$0")}
base=()
for kv in ${SETS:-}; do base+=(--set "$kv"); done
rounds=${1:-3}
: "${OLD:?OLD=path of the build before}" "${NEW:?NEW=path of the build after}"
for r in $(seq 1 "$rounds"); do
  for v in plain ln-before ln; do
    case $v in
      plain) exe=$NEW; args=(${base[@]+"${base[@]}"}) ;;
      ln-before) exe=$OLD; args=(${base[@]+"${base[@]}"} --set model.layer_norm=true) ;;
      ln) exe=$NEW; args=(${base[@]+"${base[@]}"} --set model.layer_norm=true) ;;
    esac
    timeout 1200 "$exe" bench --size small --steps 5 --decode-sentences 100 --repeats 2 --set train.threads=2 \
      "${args[@]}" 2> "$out/$v-$r.err" | tail -n 1 > "$out/$v-$r.json"
  done
  echo "round $r done"
done
