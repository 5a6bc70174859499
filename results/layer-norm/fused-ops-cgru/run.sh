#!/bin/bash
# The layer-normalised model with the fused encoder and decoder ops that normalise inside (issue 48), with the cGRU
# decoder (Nematus's), against the same model before them (OLD: the fused row ops in the composed recurrence) and
# the plain model, alternated: fused-ops/run.sh with model.decoder = cgru, into this folder.
# Usage (repository root): OLD=path/to/old NEW=path/to/new bash results/layer-norm/fused-ops-cgru/run.sh [ROUNDS]
set -euo pipefail
OUT=$(dirname "$0") SETS="model.decoder=cgru" exec bash "$(dirname "$0")/../fused-ops/run.sh" "$@"
