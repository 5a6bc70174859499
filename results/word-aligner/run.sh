#!/usr/bin/env bash
# The aligner in the box (issue 66): `cgnmt align-corpus` (IBM Model 2 with fast_align's diagonal prior, both
# directions, symmetrised) on Hansards fr-en, the 447 gold-aligned NAACL 2003 test pairs appended to the
# training pairs (as statistical aligners are run), its AER on those 447 against the gold Sure/Possible links,
# for each way of combining the directions. Resumable: an alignment that exists is not computed again.
# Usage: [HOWS=...] results/word-aligner/run.sh CGNMT_BIN [TRAIN_PAIRS]   (CGNMT_DATA as for cgnmt; default: all 834k)
set -euo pipefail
cd "$(dirname "$0")"
BIN=${1:?usage: run.sh CGNMT_BIN [TRAIN_PAIRS]}
N=${2:-0}
DATA=${CGNMT_DATA:-../../../shared/data}
H=$DATA/hansards-en-fr
G=$DATA/align-en-fr-hansards
mkdir -p runs
"$BIN" --version > runs/version.txt
tag=${N}
[ "$N" = 0 ] && tag=all
if [ ! -f "runs/corpus-$tag.fr" ]; then
  if [ "$N" = 0 ]; then
    { zcat "$H/train.fr.gz"; cat "$G/test.fr"; } > "runs/corpus-$tag.fr"
    { zcat "$H/train.en.gz"; cat "$G/test.en"; } > "runs/corpus-$tag.en"
  else
    { (zcat "$H/train.fr.gz" || true) | head -n "$N"; cat "$G/test.fr"; } > "runs/corpus-$tag.fr"
    { (zcat "$H/train.en.gz" || true) | head -n "$N"; cat "$G/test.en"; } > "runs/corpus-$tag.en"
  fi
fi
total=$(wc -l < "runs/corpus-$tag.fr")
# HOWS: the combinations to run (default all three; `HOWS=intersection` for one).
for how in ${HOWS:-grow-diag-final-and intersection union}; do
  out="runs/links-$tag-$how.talp"
  if [ ! -s "$out" ]; then
    /usr/bin/time -v timeout 7200 "$BIN" align-corpus --src "runs/corpus-$tag.fr" --tgt "runs/corpus-$tag.en" \
      --symmetrize "$how" --target-first -o "$out" -q 2> "runs/time-$tag-$how.txt"
  fi
  tail -n 447 "$out" > "runs/test-$tag-$how.talp"
  "$BIN" aer --gold "$G/test.talp" --pred "runs/test-$tag-$how.talp" --json > "runs/aer-$tag-$how.json"
done
rm -f "runs/corpus-$tag.fr" "runs/corpus-$tag.en"
python3 - "$tag" "$total" <<'PY'
import json, re, sys
tag, total = sys.argv[1], int(sys.argv[2])
print(f"Training pairs: {total} ({tag}: the first training pairs, and the 447 test pairs)\n")
print("| combined by | AER | precision | recall | wall time |")
print("|---|---|---|---|---|")
import os
for how in ("grow-diag-final-and", "intersection", "union"):
    if not os.path.exists(f"runs/aer-{tag}-{how}.json"):
        continue
    r = json.load(open(f"runs/aer-{tag}-{how}.json"))
    t = open(f"runs/time-{tag}-{how}.txt").read()
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", t)
    print(f"| {how} | {100 * r['aer']:.2f} | {100 * r['precision']:.2f} | {100 * r['recall']:.2f} | {wall.group(1) if wall else '?'} |")
PY
