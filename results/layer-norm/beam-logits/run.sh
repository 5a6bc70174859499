#!/bin/bash
# Beam search of a layer-normalised model before and after its beam reads the fused logit rows (the packed
# output layer writing each row's logits in place, as the plain model's beam does) instead of a composed
# log-softmax: `cgnmt bench --size small --set model.layer_norm=true` with two builds alternated, two threads.
# Usage (repository root): OLD=path/to/cgnmt NEW=path/to/cgnmt bash results/layer-norm/beam-logits/run.sh [ROUNDS]
set -euo pipefail
out=$(dirname "$0")
rounds=${1:-3}
: "${OLD:?OLD=build before}" "${NEW:?NEW=build after}"
for r in $(seq 1 "$rounds"); do
  for v in old new; do
    exe=$OLD; [ "$v" = new ] && exe=$NEW
    timeout 900 "$exe" bench --size small --steps 1 --decode-sentences 100 --repeats 2 --set train.threads=2 \
      --set model.layer_norm=true 2> "$out/$v-$r.err" | tail -n 1 > "$out/$v-$r.json"
  done
  python3 -c "
import json
o, n = (json.load(open('$out/%s-$r.json' % v)) for v in ('old', 'new'))
print('round $r | beam 10 sentences/s old %.1f new %.1f ratio %.2f | greedy old %.1f new %.1f' % (o['decode_beam10_sent_per_s'], n['decode_beam10_sent_per_s'], n['decode_beam10_sent_per_s'] / o['decode_beam10_sent_per_s'], o['decode_greedy_sent_per_s'], n['decode_greedy_sent_per_s']))" | tee -a "$out/rounds.txt"
done
