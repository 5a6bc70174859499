#!/usr/bin/env bash
# name lambda steps [extra sets...]
set -e
B=/tmp/cgnmt-aligner
name=$1; lam=$2; steps=$3; shift 3
sets=(--set 'data.prepared="prep"' --set model.embedding_dim=64 --set model.hidden_dim=128 --set model.attention_dim=128
  --set model.layer_norm=true --set train.batch_size=32 --set train.optimizer=adam --set train.learning_rate=0.003
  --set train.max_steps=$steps --set train.eval_every=0 --set train.threads=1 --set 'train.guided_alignment="builtin"'
  --set train.guided_alignment_weight=$lam)
for s in "$@"; do sets+=(--set "$s"); done
$B train --quiet --out run-$name "${sets[@]}" 2>&1 | tail -1
head -500 prep/train.src > s500; head -500 prep/train.tgt > t500; head -500 run-$name/guided-alignment.txt > g500
$B align -m run-$name/last --src s500 --tgt t500 -o links-$name 2>/dev/null
echo "$name λ=$lam steps=$steps: $($B aer --gold g500 --pred links-$name 2>&1 | tail -1)"
echo "  final loss: $(grep loss_per_token run-$name/train.log | tail -1 | cut -c1-90)"
