#!/usr/bin/env bash
# Fine-tuning (issue 49): the demo's Tatoeba zh-en model trained further on TED talks. The model's own
# vocabularies and subwords tokenise the new data (`prepare --like`); `train --init` starts from its parameters
# with a fresh optimiser; the base and the fine-tuned model both translate a held-out TED test set with the
# demo's beam and penalties, and `cgnmt score` / `cgnmt compare` measure them against its reference.
#
#   train: IWSLT17 zh-en tst2016, its first 956 pairs; dev (model selection): its last 200 pairs
#   test:  IWSLT17 zh-en tst2017, whole (1,459 pairs)
#
# usage: scripts/fine_tuning.sh CGNMT_BINARY BASE_MODEL_DIR OUT_DIR [UPDATES]
#   BASE_MODEL_DIR: the demo's chosen model (runs/demo/model-improved/smoothed after `cgnmt demo`)
# OUT_DIR gets the record: README.md (the table), the outputs, the logs. $CGNMT_DATA or ../shared/data holds
# zh-en-testsets. A rerun starts again (a few minutes on 2 cores).
set -euo pipefail
usage="usage: $0 CGNMT_BINARY BASE_MODEL_DIR OUT_DIR [UPDATES]"
bin=$(realpath "${1:?$usage}")
base=$(realpath "${2:?$usage}")
out=${3:?$usage}
updates=${4:-400}
top=$(cd "$(dirname "$0")/.." && pwd)
data=${CGNMT_DATA:-$top/../shared/data}/zh-en-testsets
mkdir -p "$out"
out=$(realpath "$out")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
[ -f "$base/COMPLETE" ] || { echo "$base: not a finished model directory" >&2; exit 1; }

head -n 956 "$data/iwslt17-tst2016.zh" >"$work/train.zh"
head -n 956 "$data/iwslt17-tst2016.en" >"$work/train.en"
tail -n +957 "$data/iwslt17-tst2016.zh" >"$work/dev.zh"
tail -n +957 "$data/iwslt17-tst2016.en" >"$work/dev.en"
test_src=$data/iwslt17-tst2017.zh
test_ref=$data/iwslt17-tst2017.en

"$bin" prepare --like "$base" --src "$work/train.zh" --tgt "$work/train.en" --dev-src "$work/dev.zh" \
  --dev-tgt "$work/dev.en" --out "$work/prep" --force 2>&1 | tee "$out/prepare.log"
"$bin" train --quiet --init "$base" --out "$work/run" \
  --set "data.prepared=\"$work/prep\"" --set train.max_steps="$updates" --set train.eval_every=50 \
  --set train.eval_beam=5 --set train.batch_size=32 --set train.optimizer=adam \
  --set train.learning_rate=0.0005 --set train.recurrent_dropout=0.2 --set train.label_smoothing=0.1 \
  --set train.patience=0 --set train.keep_checkpoints=0 2>&1 | tee "$out/train.log"
grep '"eval"' "$work/run/train.log" >"$out/evaluations.jsonl" || true

# Beam 10 with the demo's penalties (length 1.0, coverage 0.2: chosen on Tatoeba's dev), and without penalties.
for m in base tuned; do
  dir=$base
  [ "$m" = tuned ] && dir=$work/run/best
  "$bin" translate -q -m "$dir" -b 10 --length-penalty 1.0 --coverage-penalty 0.2 -i "$test_src" \
    -o "$out/test.$m.en"
  "$bin" translate -q -m "$dir" -b 10 -i "$test_src" -o "$out/test.$m.nopen.en"
done
# The fine-tuned run's model and penalties chosen on the new dev set, as a user would after fine-tuning.
"$bin" select --run "$work/run" --tune 2>&1 | tee "$out/select.log"
read -r chosen lp cp < <(python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); c=s["candidates"][s["chosen"]]; print(c["dir"], s["length_penalty"], s["coverage_penalty"])' "$work/run/selection.json")
"$bin" translate -q -m "$chosen" -b 10 --length-penalty "$lp" --coverage-penalty "$cp" -i "$test_src" \
  -o "$out/test.tuned.chosen.en"
echo "chosen on TED dev: $(basename "$chosen"), length penalty $lp, coverage penalty $cp" >"$out/chosen.txt"
{
  echo "# Fine-tuning the demo's model on TED talks"
  echo
  echo "\`scripts/fine_tuning.sh\` on $(date -u +%Y-%m-%dT%H:%MZ), $("$bin" --version), $(nproc) cores"
  echo "($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'))."
  echo "Base model: \`${2}\`. Fine-tuned: $updates updates of 32 pairs on the first 956 pairs of IWSLT17 zh-en"
  echo "tst2016, with its last 200 pairs as dev (the model chosen on dev BLEU every 50 updates). Test: IWSLT17"
  echo "zh-en tst2017, 1,459 pairs, beam 10, length penalty 1.0, coverage penalty 0.2 (the demo's)."
  echo
  echo "## BLEU and chrF on tst2017"
  echo
  echo '```'
  for m in base tuned base.nopen tuned.nopen tuned.chosen; do
    echo "$m: $("$bin" score -r "$test_ref" -i "$out/test.$m.en") | $("$bin" score -m chrf -r "$test_ref" -i "$out/test.$m.en")"
  done
  echo '```'
  echo
  echo "(\`.nopen\`: decoded without penalties; \`tuned.chosen\`: the fine-tuned run's model and penalties"
  echo "chosen on the TED dev set by \`cgnmt select --tune\`: $(cat "$out/chosen.txt" | cut -d: -f2-).)"
  echo
  echo "## Paired tests, fine-tuned against base (with the demo's penalties; without; chosen on TED dev against base without)"
  echo
  echo '```'
  (cd "$out" && "$bin" compare --test bs -r "$test_ref" test.base.en test.tuned.en 2>&1)
  (cd "$out" && "$bin" compare --test bs -r "$test_ref" test.base.nopen.en test.tuned.nopen.en 2>&1)
  (cd "$out" && "$bin" compare --test bs -r "$test_ref" test.base.nopen.en test.tuned.chosen.en 2>&1)
  echo '```'
  echo
  echo "## Dev evaluations while fine-tuning (update 0 is the base model)"
  echo
  echo '```'
  cat "$out/evaluations.jsonl"
  echo '```'
} >"$out/README.md"
cat "$out/README.md"
