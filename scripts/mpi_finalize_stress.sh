#!/usr/bin/env bash
# Run the same small MPI training job N times over TCP on 127.0.0.1 and count how each ended: the measurement
# behind the README's "The end" (the guard for an MPI_Finalize that never returns, src/cluster/finalize.rs).
# usage: scripts/mpi_finalize_stress.sh CGNMT_BINARY [N=100] [RANKS=2]
#   (the binary built with --features mpi; $CGNMT_DATA or ../shared/data holds tatoeba-zh-en)
set -uo pipefail
bin=$(realpath "${1:?usage: $0 CGNMT_BINARY [N] [RANKS]}")
n=${2:-100}
ranks=${3:-2}
data=${CGNMT_DATA:-$(cd "$(dirname "$0")/../.." && pwd)/shared/data}/tatoeba-zh-en
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$bin" prepare --src "$data/train.zh" --tgt "$data/train.en" --dev-src "$data/dev.zh" --dev-tgt "$data/dev.en" \
  --limit 400 --out "$work/prep" --force >/dev/null 2>&1 || { echo "prepare failed" >&2; exit 1; }
ok=0 guarded=0 hung=0 failed=0
for i in $(seq 1 "$n"); do
  rm -rf "$work/run"
  MPIR_CVAR_NOLOCAL=1 UCX_TLS=tcp,self UCX_NET_DEVICES=lo timeout 60 mpiexec -n "$ranks" "$bin" train --quiet \
    --out "$work/run" --set "data.prepared=\"$work/prep\"" --set model.embedding_dim=16 --set model.hidden_dim=24 \
    --set model.attention_dim=16 --set train.batch_size=16 --set train.eval_max_sentences=16 --set train.eval_beam=2 \
    --set train.threads=1 --set train.max_steps=30 --set train.eval_every=10 --set model.decoder=cgru \
    --set model.context_gate=both >"$work/log" 2>&1
  rc=$?
  if [ "$rc" = 0 ] && [ -f "$work/run/last/COMPLETE" ]; then
    ok=$((ok + 1))
    grep -q "MPI_Finalize has not returned" "$work/log" && guarded=$((guarded + 1))
  elif [ "$rc" = 124 ]; then
    hung=$((hung + 1))
  else
    failed=$((failed + 1))
    echo "job $i: exit $rc" >&2
    tail -5 "$work/log" >&2
  fi
done
echo "$n jobs of $ranks ranks over TCP: $ok ended with status 0 ($guarded through the guard), $hung hung (60 s), $failed failed"
[ "$ok" = "$n" ]
