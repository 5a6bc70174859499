#!/usr/bin/env bash
# Does a change of code layout change any output? Trains every decoder variant for 40 updates with two
# builds of cgnmt (same data, seed and settings), then compares, variant by variant, the training losses,
# the dev BLEU, the saved parameters, the translation of 200 test sentences (hypotheses and the dump of
# attention and gate values; and greedy, int8, shortlist and two-model ensemble n-best outputs) and the
# attention alignments (links and soft matrices with gate values) of 100 dev pairs byte for byte. Prints one
# line per variant and exits non-zero on any difference.
# With DEEP=1, the layer-normalised and deep variants (model.layer_norm, model.encoder_layers,
# model.decoder_transition_depth) instead of the one-layer ones: for a change that must alter neither.
# With KERNELS=reference, every command runs the composed reference kernels (training then runs the decoder
# step by step instead of the fused sequence op).
# Usage: [DEEP=1] scripts/same_outputs.sh OLD_BIN NEW_BIN [OUTDIR]   (CGNMT_DATA as for cgnmt; default ../shared/data)
set -euo pipefail
cd "$(dirname "$0")/.."
OLD=${1:?usage: scripts/same_outputs.sh OLD_BIN NEW_BIN [OUTDIR]}
NEW=${2:?usage: scripts/same_outputs.sh OLD_BIN NEW_BIN [OUTDIR]}
OUT=${3:-runs/same-outputs}
DATA=${CGNMT_DATA:-../shared/data}
T=$DATA/tatoeba-zh-en
mkdir -p "$OUT"
head -n 200 "$T/test.zh" > "$OUT/test.zh"
if [ ! -f "$OUT/prepared/preprocess.json" ]; then
  timeout 600 "$NEW" prepare --src "$T/train.zh" --tgt "$T/train.en" --dev-src "$T/dev.zh" --dev-tgt "$T/dev.en" \
    --src-lang zh --tgt-lang en --limit 4000 --out "$OUT/prepared" --force > /dev/null
fi
# One shortlist lexicon for both builds, and 100 tokenised dev pairs to align.
if [ ! -f "$OUT/lex.tsv" ]; then
  timeout 600 "$NEW" shortlist --src "$OUT/prepared/train.src" --tgt "$OUT/prepared/train.tgt" -o "$OUT/lex.tsv" > /dev/null 2>&1
fi
head -n 100 "$OUT/prepared/dev.src" > "$OUT/align.src"
head -n 100 "$OUT/prepared/dev.tgt" > "$OUT/align.tgt"

# name | settings
VARIANTS=(
  "gru|model.decoder=gru model.context_gate=none"
  "gru-source|model.decoder=gru model.context_gate=source"
  "gru-target|model.decoder=gru model.context_gate=target"
  "gru-both|model.decoder=gru model.context_gate=both"
  "vanilla|model.decoder=vanilla model.context_gate=none"
  "vanilla-both|model.decoder=vanilla model.context_gate=both"
  "cgru-both|model.decoder=cgru model.context_gate=both"
  "gru-coverage-both|model.decoder=gru model.context_gate=both model.coverage=neural model.coverage_gated=true"
  "gating-scalar|model.decoder=gru model.context_gate=none model.gating_scalar=true"
  "modern-both|model.decoder=gru model.context_gate=both model.tied_output_embeddings=true train.label_smoothing=0.1 train.recurrent_dropout=0.2 train.exponential_smoothing=0.01"
)
if [ -n "${DEEP:-}" ]; then
  deep="model.encoder_layers=2 model.residual=true model.decoder_transition_depth=2"
  VARIANTS=(
    "gru-ln|model.decoder=gru model.context_gate=none model.layer_norm=true"
    "gru-ln-both|model.decoder=gru model.context_gate=both model.layer_norm=true"
    "vanilla-ln-both|model.decoder=vanilla model.context_gate=both model.layer_norm=true"
    "cgru-ln-both|model.decoder=cgru model.context_gate=both model.layer_norm=true"
    "deep-gru-both|model.decoder=gru model.context_gate=both $deep"
    "deep-gru-ln-both|model.decoder=gru model.context_gate=both model.layer_norm=true $deep"
    "deep-cgru-ln-coverage-both|model.decoder=cgru model.context_gate=both model.layer_norm=true model.coverage=neural $deep"
  )
fi
kflag=()
[ -n "${KERNELS:-}" ] && kflag=(--kernels "$KERNELS")
status=0
for v in "${VARIANTS[@]}"; do
  name=${v%%|*}
  sets=()
  for s in ${v#*|}; do sets+=(--set "$s"); done
  for side in old new; do
    bin=$OLD; [ $side = new ] && bin=$NEW
    dir="$OUT/$name/$side"
    rm -rf "$dir"
    timeout 900 "$bin" train "${kflag[@]}" --quiet --out "$dir" --set data.prepared=\""$OUT/prepared"\" \
      --set data.src_vocab_size=2000 --set data.tgt_vocab_size=2000 \
      --set model.embedding_dim=32 --set model.hidden_dim=64 --set model.attention_dim=64 \
      --set model.coverage_dim=4 --set train.batch_size=32 --set train.optimizer=adam \
      --set train.learning_rate=0.003 --set train.max_steps=40 --set train.eval_every=20 \
      --set train.eval_max_sentences=40 --set train.eval_beam=3 --set train.seed=7 --set train.threads=1 \
      "${sets[@]}"
    timeout 600 "$bin" translate "${kflag[@]}" -q -m "$dir/last" --beam 5 --dump "$dir/test.dump.jsonl" \
      -i "$OUT/test.zh" -o "$dir/test.hyp"
    timeout 600 "$bin" translate "${kflag[@]}" -q -m "$dir/last" --beam 1 -i "$OUT/test.zh" -o "$dir/test.greedy.hyp"
    timeout 600 "$bin" translate "${kflag[@]}" -q -m "$dir/last" --beam 5 --int8 -i "$OUT/test.zh" -o "$dir/test.int8.hyp"
    timeout 600 "$bin" translate "${kflag[@]}" -q -m "$dir/last" --beam 5 --shortlist "$OUT/lex.tsv" \
      -i "$OUT/test.zh" -o "$dir/test.shortlist.hyp"
    timeout 600 "$bin" translate "${kflag[@]}" -q -m "$dir/last" -m "$dir/best" --beam 5 --nbest 3 \
      -i "$OUT/test.zh" -o "$dir/test.ensemble.hyp"
    timeout 600 "$bin" align "${kflag[@]}" -m "$dir/last" --src "$OUT/align.src" --tgt "$OUT/align.tgt" \
      -o "$dir/align.links" --soft "$dir/align.soft.jsonl" > /dev/null
    # The losses and dev scores of the log, without its times.
    python3 -c 'import json,sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(json.dumps({k: v for k, v in r.items() if "second" not in k and not k.endswith("per_s")}, sort_keys=True))' \
      "$dir/train.log" > "$dir/losses.txt"
  done
  diffs=()
  cmp -s "$OUT/$name/old/losses.txt" "$OUT/$name/new/losses.txt" || diffs+=(losses)
  for f in "$OUT/$name/old/last/"*.safetensors; do
    cmp -s "$f" "$OUT/$name/new/last/$(basename "$f")" || diffs+=("$(basename "$f")")
  done
  cmp -s "$OUT/$name/old/test.hyp" "$OUT/$name/new/test.hyp" || diffs+=(test.hyp)
  cmp -s "$OUT/$name/old/test.dump.jsonl" "$OUT/$name/new/test.dump.jsonl" || diffs+=(dump)
  for f in test.greedy.hyp test.int8.hyp test.shortlist.hyp test.ensemble.hyp align.links align.soft.jsonl; do
    cmp -s "$OUT/$name/old/$f" "$OUT/$name/new/$f" || diffs+=("$f")
  done
  n=$(wc -l < "$OUT/$name/new/losses.txt")
  if [ ${#diffs[@]} -eq 0 ]; then
    echo "$name: identical ($n loss/score values, parameters, 200 translations and their dump, greedy, int8, shortlist, ensemble n-best, 100 alignments)"
  else
    echo "$name: DIFFERENT: ${diffs[*]}"
    status=1
  fi
done
exit $status
