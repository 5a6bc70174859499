#!/bin/bash
# Does a change alter the speed? `cgnmt bench --size small` with two builds, OLD and NEW, alternated
# (OLD NEW OLD NEW ...), two threads each; run it with nothing else running. Writes one JSON and one stderr
# file per run into OUTDIR; `scripts/bench_summary.py OUTDIR` turns them into a table of medians and of each
# round's paired ratio new / old.
# Usage (repository root): OLD=path/to/old/cgnmt NEW=path/to/new/cgnmt bash scripts/bench_pair.sh OUTDIR [ROUNDS]
# OLD_ARGS / NEW_ARGS add arguments to one side's bench (e.g. the same build twice, NEW_ARGS='--set
# train.guided_alignment="builtin"' to time an option against its absence).
set -euo pipefail
out=${1:?usage: OLD=... NEW=... scripts/bench_pair.sh OUTDIR [ROUNDS]}
rounds=${2:-7}
: "${OLD:?OLD=path of the build before the change}" "${NEW:?NEW=path of the build after it}"
mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
  for side in old new; do
    exe=$OLD; extra=${OLD_ARGS:-}
    [ $side = new ] && exe=$NEW && extra=${NEW_ARGS:-}
    # shellcheck disable=SC2086 # (the extra arguments split on spaces)
    timeout 900 "$exe" bench --size small --steps 9 --decode-sentences 100 --repeats 3 --set train.threads=2 $extra \
      2> "$out/$side-$r.err" | tail -n 1 > "$out/$side-$r.json"
  done
  echo "round $r done"
done
