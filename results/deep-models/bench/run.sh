#!/bin/bash
# Do stacked encoders and deep transitions (issue 48) change the one-layer model's speed? (The fused ops gained
# code paths a one-layer model skips.)
# `cgnmt bench --size small` with the build from before (OLD) and after (NEW), alternated
# (OLD NEW OLD NEW ...), two threads each, nothing else running. Writes one JSON and one stderr file per run;
# scripts/bench_summary.py turns them into the table of README.md.
# Usage (repository root): OLD=path/to/old/cgnmt NEW=path/to/new/cgnmt bash results/deep-models/bench/run.sh [ROUNDS]
set -euo pipefail
# The alternated runs themselves: scripts/bench_pair.sh (the same bench command, into this folder).
exec bash "$(dirname "$0")/../../../scripts/bench_pair.sh" "$(dirname "$0")" "${1:-7}"
