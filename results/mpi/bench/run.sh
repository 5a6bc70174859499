#!/bin/bash
# One process × 2 threads against 2 ranks × 1 thread (shared memory, then TCP on 127.0.0.1), the same
# data-parallel update loop (`cgnmt bench --data-parallel`), at the small and the paper size, alternated.
# Run from the repository root with a `--features mpi` build: bash results/mpi/bench/run.sh [REPEATS]
set -euo pipefail
out=$(dirname "$0")
exe=${CGNMT:-target/release/cgnmt}
repeats=${1:-3}
tcp=(env MPIR_CVAR_NOLOCAL=1 UCX_TLS=tcp,self UCX_NET_DEVICES=lo)
for size in small paper; do
  steps=8; [ $size = paper ] && steps=4
  for r in $(seq 1 "$repeats"); do
    timeout 900 "$exe" bench --data-parallel --size $size --steps $steps --set train.threads=2 \
      > "$out/$size-one-$r.json" 2> "$out/$size-one-$r.err"
    timeout 900 mpiexec -n 2 "$exe" bench --size $size --steps $steps --set train.threads=1 \
      > "$out/$size-shm-$r.json" 2> "$out/$size-shm-$r.err"
    timeout 900 "${tcp[@]}" mpiexec -n 2 "$exe" bench --size $size --steps $steps --set train.threads=1 \
      > "$out/$size-tcp-$r.json" 2> "$out/$size-tcp-$r.err"
    echo "$size round $r done"
  done
done
