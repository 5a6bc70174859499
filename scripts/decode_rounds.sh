#!/usr/bin/env bash
# Alternated rounds of beam-10 decoding of a prepared test set, one line per round with sentences/s per mode
# (what docs/design-notes.md's decoding tables report). The machine's speed drifts within minutes, so the modes run
# one after another in every round and ratios are taken per round.
# Usage: scripts/decode_rounds.sh MODEL PREPARED_DIR [ROUNDS]
#   MODES   modes to run, in order (default "exact int8 shortlist int8+shortlist"); "onmt" adds OpenNMT-py
#   LEX     lexicon for the shortlist modes (default PREPARED_DIR/lex.tsv, learnt by `cgnmt shortlist` if absent)
#   BIN     the cgnmt binary (default ./target/release/cgnmt); BASE_BIN adds a mode "base" (exact) and
#           "base-int8" with another build, e.g. an earlier commit's
#   ONMT_PY, ONMT_MODEL  OpenNMT-py's python (a venv with OpenNMT-py) and model for the "onmt" mode
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:?model directory}
PREP=${2:?prepared directory (test.src)}
ROUNDS=${3:-5}
MODES=${MODES:-"exact int8 shortlist int8+shortlist"}
BIN=${BIN:-./target/release/cgnmt}
LEX=${LEX:-$PREP/lex.tsv}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
if [[ " $MODES " == *shortlist* && ! -f "$LEX" ]]; then
  $BIN shortlist --src "$PREP/train.src" --tgt "$PREP/train.tgt" -o "$LEX" --quiet
fi
n=$(wc -l < "$PREP/test.src")
rate() { grep -o '([0-9.]* sentences/s' | tr -d '(' | cut -d' ' -f1; }
one() {
  local bin=$1; shift
  "$bin" translate -m "$MODEL" -i "$PREP/test.src" -o "$OUT/hyp" --beam 10 --pretokenized "$@" 2>&1 | rate
}
for r in $(seq 1 "$ROUNDS"); do
  line="round $r"
  for mode in $MODES; do
    case $mode in
      exact) v=$(one "$BIN") ;;
      int8) v=$(one "$BIN" --int8) ;;
      shortlist) v=$(one "$BIN" --shortlist "$LEX") ;;
      int8+shortlist) v=$(one "$BIN" --int8 --shortlist "$LEX") ;;
      base) v=$(one "${BASE_BIN:?}") ;;
      base-int8) v=$(one "${BASE_BIN:?}" --int8) ;;
      onmt)
        t=$(OMP_NUM_THREADS=2 "${ONMT_PY:?}" -m onmt.bin.translate -model "${ONMT_MODEL:?}" -src "$PREP/test.src" \
          -output "$OUT/onmt.hyp" -beam_size 10 -batch_size 32 2>&1 | grep 'Time w/o' | awk '{print $NF}')
        v=$(python3 -c "print(round($n / $t, 1))") ;;
      *) echo "unknown mode $mode" >&2; exit 2 ;;
    esac
    line="$line | $mode $v"
  done
  echo "$line"
done
