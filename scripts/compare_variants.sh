#!/usr/bin/env bash
# Same-budget comparison of decoder variants on Tatoeba zh-en (issues: gates table, coverage table).
# The same number of updates for every variant; the final model (last/) is scored on the test set.
# Usage: scripts/compare_variants.sh [STEPS] [OUTDIR]  (prepares data into OUTDIR/prepared if needed)
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-1000}
OUT=${2:-runs/compare}
DATA=${CGNMT_DATA:-../shared/data}
BIN=${BIN:-./target/release/cgnmt}
T=$DATA/tatoeba-zh-en
mkdir -p "$OUT"
if [ ! -f "$OUT/prepared/preprocess.json" ]; then
  $BIN prepare --src $T/train.zh --tgt $T/train.en --dev-src $T/dev.zh --dev-tgt $T/dev.en \
    --test-src $T/test.zh --test-tgt $T/test.en --out "$OUT/prepared" --force
fi
run() {
  local name=$1; shift
  local dir="$OUT/$name"
  if [ ! -f "$dir/done" ]; then
    local t0=$(date +%s)
    if [ -f "$dir/last/train_state.json" ]; then
      $BIN train --quiet --resume "$dir"
    else
    rm -rf "$dir"
    $BIN train --quiet --out "$dir" --set data.prepared=\""$OUT/prepared"\" \
      --set data.src_vocab_size=8000 --set data.tgt_vocab_size=6000 \
      --set model.embedding_dim=128 --set model.hidden_dim=256 --set model.attention_dim=256 \
      --set train.batch_size=64 --set train.optimizer=adam --set train.learning_rate=${LR:-0.001} \
      --set train.max_steps=$STEPS --set train.eval_every=$((STEPS/4)) --set train.eval_max_sentences=400 \
      --set train.eval_beam=5 --set train.seed=1234 --set train.threads=${THREADS:-1} "$@"
    fi
    local t1=$(date +%s)
    $BIN translate -q -m "$dir/last" --beam 10 --dump "$dir/test.dump.jsonl" -i $T/test.zh -o "$dir/test.hyp"
    local t2=$(date +%s)
    echo "train_seconds=$((t1-t0)) decode_seconds=$((t2-t1))" > "$dir/done"
  fi
  local best=$(python3 -c "import json;s=json.load(open('$dir/last/train_state.json'));print('%.2f at step %d'%(s['best_bleu'],s['best_step']))")
  local test=$($BIN score -r $T/test.en -i "$dir/test.hyp" --mteval-v11b --json | python3 -c "import json,sys;print('%.2f'%json.load(sys.stdin)['score'])")
  local sacre=$($BIN score -r $T/test.en -i "$dir/test.hyp" --json | python3 -c "import json,sys;print('%.2f'%json.load(sys.stdin)['score'])")
  echo "| $name | $best | $test | $sacre | $(cat $dir/done) |" | tee -a "$OUT/results.md"
}
VARIANTS=${VARIANTS:-"gru-none gru-both vanilla-none vanilla-both gru-none-neural gru-both-neural"}
for v in $VARIANTS; do
  case $v in
    gru-none) run $v --set model.decoder=gru --set model.context_gate=none ;;
    gru-both) run $v --set model.decoder=gru --set model.context_gate=both ;;
    vanilla-none) run $v --set model.decoder=vanilla --set model.context_gate=none ;;
    vanilla-both) run $v --set model.decoder=vanilla --set model.context_gate=both ;;
    gru-none-neural) run $v --set model.decoder=gru --set model.context_gate=none --set model.coverage=neural ;;
    gru-both-neural) run $v --set model.decoder=gru --set model.context_gate=both --set model.coverage=neural ;;
    *) echo "unknown variant $v"; exit 2 ;;
  esac
done
