#!/usr/bin/env bash
# Corpora of any size: the Hansards fr-en training corpus (833,605 pairs) repeated 1, 10 and 30 times (to 25M
# pairs), each prepared (BPE 16,000 / 16,000) and trained for 100 updates at the small size, with the wall time
# and the peak resident memory of every step (GNU time); the model's own memory is the same training on the
# first 26,000 pairs of the same prepared corpus (`data.limit`: the same vocabularies, the same model). Rows go
# to OUT_DIR/runs.tsv as they are measured and a rerun skips the rows it has, so an interrupted run resumes;
# OUT_DIR/table.md is written from runs.tsv at the end.
#
# usage: scripts/large_corpus.sh CGNMT_BINARY OUT_DIR [WORK_DIR]
#   OLD=BINARY      also measure a binary from before the token store (its prepare and train at 1×)
#   MPI=BINARY      also train at the largest size on 2 ranks (mpiexec; the binary built with --features mpi)
#   REPEATS="1 10 30"  the repetitions
# WORK_DIR (default /tmp/cgnmt-large) holds the repeated corpora and prepared directories: about 0.4 GB per
# repetition of Hansards. $CGNMT_DATA or ../shared/data holds hansards-en-fr.
set -euo pipefail
bin=$(realpath "${1:?usage: $0 CGNMT_BINARY OUT_DIR [WORK_DIR]}")
out=${2:?usage: $0 CGNMT_BINARY OUT_DIR [WORK_DIR]}
work=${3:-/tmp/cgnmt-large}
top=$(cd "$(dirname "$0")/.." && pwd)
data=${CGNMT_DATA:-$top/../shared/data}/hansards-en-fr
repeats=${REPEATS:-1 10 30}
mkdir -p "$out/logs" "$work"
out=$(realpath "$out")
work=$(realpath "$work")
runs=$out/runs.tsv
[ -f "$runs" ] || printf 'step\trepeats\tpairs\tbinary\twall_s\tpeak_rss_kb\tcpu_percent\n' >"$runs"
have() { awk -F'\t' -v s="$1" '$1 == s { found = 1 } END { exit !found }' "$runs"; }
# measure NAME REPEATS BINARY_LABEL PREPARED_DIR COMMAND...: run under GNU time, append a row.
measure() {
  local name=$1 rep=$2 label=$3 prep=$4
  shift 4
  if have "$name"; then echo "have $name"; return; fi
  echo "measuring $name"
  /usr/bin/time -f '%e\t%M\t%P' -o "$work/time" "$@" >"$out/logs/$name.log" 2>&1
  local pairs
  pairs=${PAIRS:-$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["train"]["pairs_kept"])' "$prep/prepare.json")}
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$rep" "$pairs" "$label" "$(tail -1 "$work/time" | tr -d '%')" >>"$runs"
}
corpus() { # the corpus repeated $1 times (gzip members concatenated: one gzip stream to a reader)
  local d=$work/x$1
  if [ ! -f "$d/done" ]; then
    mkdir -p "$d"
    for side in fr en; do
      for _ in $(seq "$1"); do cat "$data/train.$side.gz"; done >"$d/train.$side.gz"
    done
    touch "$d/done"
  fi
  echo "$d"
}
prepare() { # prepare BINARY CORPUS_DIR OUT [extra...] (by default BPE 16,000 / 16,000)
  local b=$1 c=$2 p=$3
  shift 3
  [ $# -gt 0 ] || set -- --src-lang fr --tgt-lang en --bpe-src 16000 --bpe-tgt 16000
  "$b" prepare --src "$c/train.fr.gz" --tgt "$c/train.en.gz" --dev-src "$data/dev.fr" --dev-tgt "$data/dev.en" \
    --out "$p" --force "$@"
}
train() { # train BINARY PREPARED OUT [launcher...] ($LIMIT: data.limit)
  local b=$1 p=$2 o=$3
  shift 3
  rm -rf "$o"
  "$@" "$b" train --quiet -c "$top/configs/tatoeba-small.toml" --out "$o" --set "data.prepared=\"$p\"" \
    --set data.src_vocab_size=20000 --set data.tgt_vocab_size=20000 --set train.max_steps=100 \
    --set train.eval_every=0 --set train.keep_checkpoints=0 --set "data.limit=${LIMIT:-0}"
}
export -f prepare train
export data top LIMIT

for r in $repeats; do
  c=$(corpus "$r")
  measure "prepare-x$r" "$r" new "$work/prep-x$r" bash -c 'prepare "$@"' _ "$bin" "$c" "$work/prep-x$r"
  if [ "$r" = 1 ]; then
    # The model's own memory: the first 26,000 pairs of the same prepared corpus.
    LIMIT=26000 PAIRS=26000 measure "train-26k" 0 new "$work/prep-x1" bash -c 'train "$@"' _ "$bin" \
      "$work/prep-x1" "$work/run"
  fi
  measure "train-x$r" "$r" new "$work/prep-x$r" bash -c 'train "$@"' _ "$bin" "$work/prep-x$r" "$work/run"
  du -sb "$work/prep-x$r"/train.*.store | awk -v r="$r" '{ s += $1 } END { print r "\t" s }' >>"$work/store-bytes"
done
if [ -n "${OLD:-}" ]; then
  old=$(realpath "$OLD")
  c=$(corpus 1)
  measure "prepare-x1-old" 1 old "$work/prep-x1" bash -c 'prepare "$@"' _ "$old" "$c" "$work/prep-x1-old"
  # The old binary reads the text files of the same prepared directory.
  measure "train-x1-old" 1 old "$work/prep-x1" bash -c 'train "$@"' _ "$old" "$work/prep-x1" "$work/run"
fi
if [ -n "${MPI:-}" ]; then
  mpi=$(realpath "$MPI")
  last=${repeats##* }
  # GNU time reports the largest process: the peak of the larger rank.
  measure "train-x$last-2ranks" "$last" mpi "$work/prep-x$last" bash -c 'train "$@"' _ "$mpi" \
    "$work/prep-x$last" "$work/run" mpiexec -n 2
fi
rm -rf "$work/run"

python3 - "$runs" "$out/table.md" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
by = {r["step"]: r for r in rows}
own = float(by["train-26k"]["peak_rss_kb"]) / 1024 if "train-26k" in by else None
out = ["| step | repeats of Hansards | pairs | binary | wall (s) | peak RSS (MB) | above the model's own (MB) | pairs per minute |",
       "|---|---:|---:|---|---:|---:|---:|---:|"]
for r in rows:
    rss = float(r["peak_rss_kb"]) / 1024
    wall = float(r["wall_s"])
    above = f"{rss - own:.0f}" if own is not None and r["step"].startswith("train") else ""
    rate = f"{int(r['pairs']) / wall * 60 / 1e6:.2f}M" if r["step"].startswith("prepare") else ""
    out.append(f"| {r['step']} | {r['repeats']} | {int(r['pairs']):,} | {r['binary']} | {wall:.1f} | {rss:.0f} | {above} | {rate} |")
open(sys.argv[2], "w").write("\n".join(out) + "\n")
print("\n".join(out))
PY
