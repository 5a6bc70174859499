#!/usr/bin/env bash
# The demo's recipe trained for 20 updates in one process and on 2 and 3 ranks (mpiexec on this machine), with
# and without dropout and label smoothing: the mean loss per target token of updates 1-10 and 11-20 (train.log's
# two windows) of each, as a Markdown table, and the largest parameter difference against one process. With
# each sentence's dropout masks drawn from its corpus index, every row's columns agree up to summation order.
# usage: scripts/mpi_dropout_equivalence.sh CGNMT_BINARY OUT_DIR
#   (the binary built with --features mpi; $CGNMT_DATA or ../shared/data holds tatoeba-zh-en)
set -euo pipefail
bin=$(realpath "${1:?usage: $0 CGNMT_BINARY OUT_DIR}")
out=${2:?usage: $0 CGNMT_BINARY OUT_DIR}
top=$(cd "$(dirname "$0")/.." && pwd)
data=${CGNMT_DATA:-$top/../shared/data}/tatoeba-zh-en
mkdir -p "$out"
out=$(realpath "$out")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The demo's preparation (BPE 6,000 / 4,000).
"$bin" prepare --src "$data/train.zh" --tgt "$data/train.en" --dev-src "$data/dev.zh" --dev-tgt "$data/dev.en" \
  --src-lang zh --tgt-lang en --bpe-src 6000 --bpe-tgt 4000 --out "$work/prep" --force >/dev/null 2>&1
common=(--set "data.prepared=\"$work/prep\"" --set train.max_steps=20 --set train.threads=1 --set train.eval_every=0
  --set train.exponential_smoothing=0 --set train.keep_checkpoints=0)
rows=(
  "recurrent_dropout = 0, label_smoothing = 0|train.recurrent_dropout=0 train.label_smoothing=0"
  "recurrent_dropout = 0 (label smoothing 0.1)|train.recurrent_dropout=0"
  "recurrent_dropout = 0.2 (the demo's recipe, label_smoothing = 0)|train.label_smoothing=0"
  "every dropout kind (embedding 0.2, annotation 0.2, readout 0.3, recurrent 0.2) and label smoothing 0.1|train.embedding_dropout=0.2 train.annotation_dropout=0.2 train.readout_dropout=0.3"
)
windows() { # the two logged windows' losses, "a / b"
  python3 -c 'import json,sys; l=[json.loads(x)["loss_per_token"] for x in open(sys.argv[1]) if "\"step\"" in x]; print(" / ".join("%.6f" % v for v in l))' "$1/train.log"
}
largest() { # the largest and the median absolute parameter difference between two runs
  python3 - "$1" "$2" <<'PY'
import json, struct, sys
def load(p):
    b = open(p + "/last/model.safetensors", "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); out = {}
    for k, v in h.items():
        if k == "__metadata__": continue
        s, e = v["data_offsets"]; raw = b[8 + n + s:8 + n + e]
        out[k] = struct.unpack("<%df" % (len(raw) // 4), raw)
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
d = sorted(abs(x - y) for k in a for x, y in zip(a[k], b[k]))
print("%.1e (median %.1e)" % (d[-1], d[len(d) // 2]))
PY
}
{
  echo "| settings | mean loss per token, updates 1–10 / 11–20, one process | 2 ranks | 3 ranks | largest (median) parameter difference after 20 updates, 2 / 3 ranks against one |"
  echo "|---|---|---|---|---|"
} >"$out/table.md"
for row in "${rows[@]}"; do
  name=${row%%|*}
  sets=()
  for kv in ${row#*|}; do sets+=(--set "$kv"); done
  tag=$(echo "$name" | tr -c 'a-z0-9' '_' | cut -c1-40)
  "$bin" train -c "$top/configs/tatoeba-small.toml" "${common[@]}" "${sets[@]}" --out "$work/$tag-1" -q
  for n in 2 3; do
    timeout 300 mpiexec -n "$n" "$bin" train -c "$top/configs/tatoeba-small.toml" "${common[@]}" "${sets[@]}" \
      --out "$work/$tag-$n" -q
  done
  echo "| \`$name\` | $(windows "$work/$tag-1") | $(windows "$work/$tag-2") | $(windows "$work/$tag-3") | $(largest "$work/$tag-1" "$work/$tag-2") / $(largest "$work/$tag-1" "$work/$tag-3") |" >>"$out/table.md"
done
{
  echo
  echo "$("$bin" --version), $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), MPICH $(mpiexec --version 2>/dev/null | sed -n "s/^ *Version: *//p" | head -1)"
} >>"$out/table.md"
cat "$out/table.md"
