#!/bin/bash
# The deep model's training against PyTorch eager, op for op (issue 48), run again with nothing else running
# (the plans paused): torch-deep/run.sh into this folder (its 865453e/ subfolder: OUT=…/865453e).
# Usage (repository root): EXE=path/to/cgnmt TORCH_PY=venv/bin/python bash results/layer-norm/torch-deep-paused/run.sh [ROUNDS]
set -euo pipefail
OUT=${OUT:-$(dirname "$0")} exec bash "$(dirname "$0")/../torch-deep/run.sh" "$@"
