#!/bin/bash
# Layer-normalised decoding with the gate's mix fused (issue 48): the decoding step's transition reads the fused
# mix of the word and context terms and the normalised recurrent products, against the build before (OLD: the
# gate's scales applied term by term) and the plain model, alternated: fused-ops/run.sh (the both gate), into
# this folder; `python3 ../fused-ops/summarise.py FOLDER` summarises.
# Usage (repository root): OLD=path/to/old NEW=path/to/new bash results/layer-norm/decode-mix/run.sh [ROUNDS]
set -euo pipefail
OUT=$(dirname "$0") exec bash "$(dirname "$0")/../fused-ops/run.sh" "$@"
