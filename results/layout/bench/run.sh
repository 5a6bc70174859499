#!/bin/bash
# Does the layout move (issue 39: folders by role, kernels apart, the long functions split) change the speed?
# `cgnmt bench --size small` with the build from before the move (OLD) and after it (NEW), alternated
# (OLD NEW OLD NEW ...), two threads each, nothing else running. Writes one JSON and one stderr file per run;
# scripts/bench_summary.py turns them into the table of README.md.
# Usage (repository root): OLD=path/to/old/cgnmt NEW=path/to/new/cgnmt bash results/layout/bench/run.sh [ROUNDS]
set -euo pipefail
# The alternated runs themselves: scripts/bench_pair.sh (the same bench command, into this folder).
exec bash "$(dirname "$0")/../../../scripts/bench_pair.sh" "$(dirname "$0")" "${1:-7}"
