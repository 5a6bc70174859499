#!/usr/bin/env bash
# Terminology constraints on the Tatoeba zh-en test set (issue 65): BLEU with and without constraints drawn
# from the reference (Post & Vilar 2018's protocol: 1 and 2 phrases of 1-3 words per sentence), the share
# of constraints met, and the decoding time against unconstrained beam 10 (alternated, medians).
# Usage: results/constraints/run.sh CGNMT_BIN MODEL_DIR [REPEATS]   (CGNMT_DATA as for cgnmt)
# Resumable: a setting whose output exists is not decoded again for BLEU (the timings are always re-run).
set -euo pipefail
cd "$(dirname "$0")"
BIN=${1:?usage: run.sh CGNMT_BIN MODEL_DIR [REPEATS]}
MODEL=${2:?usage: run.sh CGNMT_BIN MODEL_DIR [REPEATS]}
REPEATS=${3:-3}
DATA=${CGNMT_DATA:-../../../shared/data}
T=$DATA/tatoeba-zh-en
mkdir -p runs
"$BIN" --version > runs/version.txt
cp "$MODEL/decoding.toml" runs/model-decoding.toml 2>/dev/null || echo "(the model keeps no decoding.toml)" > runs/model-decoding.toml
# The constraint files: phrases of the reference whose words all occur in the training targets.
python3 draw_constraints.py "$T/train.en" "$T/test.en" runs
# A phrase the model cannot spell (a subword piece outside its target vocabulary) is refused by translate,
# naming its line: that line's phrases are dropped (listed in runs/dropped-K.txt) and the check runs again.
for k in 1 2; do
  : > "runs/dropped-$k.txt"
  while true; do
    if "$BIN" translate -q -m "$MODEL" -i "$T/test.zh" --constraints "runs/constraints-$k.tsv" --max-input-words 0 -o /dev/null --beam 1 2> runs/check.err; then
      break
    fi
    line=$(grep -o 'line [0-9]*' runs/check.err | head -1 | cut -d' ' -f2)
    grep -q "not in the model's target vocabulary" runs/check.err || { cat runs/check.err; exit 1; }
    echo "$line $(sed -n "${line}p" "runs/constraints-$k.tsv")" >> "runs/dropped-$k.txt"
    sed -i "${line}s/.*//" "runs/constraints-$k.tsv"
  done
done
rm -f runs/check.err
for k in 0 1 2; do
  args=()
  [ "$k" -gt 0 ] && args=(--constraints "runs/constraints-$k.tsv")
  if [ ! -s "runs/test-$k.hyp" ]; then
    timeout 3600 "$BIN" translate -q -m "$MODEL" -i "$T/test.zh" -o "runs/test-$k.hyp" "${args[@]}" 2> "runs/test-$k.err"
  fi
  "$BIN" score -r "$T/test.en" -i "runs/test-$k.hyp" > "runs/bleu-$k.txt"
done
# Timings: the three settings alternated, REPEATS rounds, each a whole test-set translation.
: > runs/times.tsv
for r in $(seq "$REPEATS"); do
  for k in 0 1 2; do
    args=()
    [ "$k" -gt 0 ] && args=(--constraints "runs/constraints-$k.tsv")
    s=$(date +%s.%N)
    timeout 3600 "$BIN" translate -q -m "$MODEL" -i "$T/test.zh" -o runs/timing.hyp "${args[@]}" 2> /dev/null
    e=$(date +%s.%N)
    echo -e "$r\t$k\t$(echo "$e - $s" | bc)" >> runs/times.tsv
  done
done
rm -f runs/timing.hyp
python3 summarise.py runs > table.md
cat table.md
