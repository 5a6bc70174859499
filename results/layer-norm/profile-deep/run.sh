#!/bin/bash
# Where the deep model's training step goes (issue 48: the share of the SGEMM peak): `cgnmt bench --size
# small-deep --lengths reference --profile-ops` (torch_reference.py's padded batch), without and with layer
# normalisation, two threads; each run's report into plain.txt and ln.txt.
# Usage (repository root): EXE=path/to/cgnmt bash results/layer-norm/profile-deep/run.sh
set -euo pipefail
out=$(dirname "$0")
: "${EXE:?EXE=path of the build}"
for v in plain ln; do
  args=()
  [ "$v" = ln ] && args=(--set model.layer_norm=true)
  timeout 900 "$EXE" bench --size small-deep --lengths reference --steps 6 --decode-sentences 10 --repeats 1 \
    --set train.threads=2 --profile-ops "${args[@]}" 2>&1 | grep -v '^{' > "$out/$v.txt"
done
