#!/usr/bin/env bash
# How closely a guided model's attention follows the links it was trained on: the first N prepared training
# pairs aligned from attention (`cgnmt align`, the run's best/ model) and scored against that run's own links
# (RUN/guided-alignment.txt, every link taken as sure) with `cgnmt aer --json`.
# Usage (repository root): bash results/guided-hansards/fit/run.sh BIN [N=500] [SYSTEM...]
set -euo pipefail
bin=${1:?usage: run.sh BIN [N] [SYSTEM...]}
n=${2:-500}
shift $(( $# >= 2 ? 2 : 1 ))
systems=("$@")
[ ${#systems[@]} -gt 0 ] || systems=(gru-ln-guided gru-ln-guided-1)
d=results/guided-hansards
out=$d/fit
tmp=$(mktemp -d)
head -n "$n" $d/prepared/train.src > "$tmp/src"
head -n "$n" $d/prepared/train.tgt > "$tmp/tgt"
"$bin" --version > "$out/version.txt"
for s in "${systems[@]}"; do
  run=$d/systems/$s/seed-1/run
  head -n "$n" "$run/guided-alignment.txt" > "$tmp/gold"
  timeout 1200 "$bin" align -m "$run/best" --src "$tmp/src" --tgt "$tmp/tgt" -o "$out/$s-seed-1.links" 2>/dev/null
  timeout 600 "$bin" aer --gold "$tmp/gold" --pred "$out/$s-seed-1.links" --json > "$out/$s-seed-1.aer.json"
  echo "$s: $(cat "$out/$s-seed-1.aer.json")"
done
rm -rf "$tmp"
