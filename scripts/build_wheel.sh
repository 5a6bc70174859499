#!/usr/bin/env bash
# The Python package's artefacts, into dist/: one abi3 wheel (CPython ≥ 3.9) tagged manylinux_2_28, linked by
# zig (from PyPI's `ziglang`) against glibc 2.28 so that it runs on common Linux distributions, and, with
# --sdist, the source distribution. The build tools go into a virtual environment of their own.
# Usage (repository root): bash scripts/build_wheel.sh [--sdist]
# Then: pip install dist/cgnmt-*.whl   (no Rust toolchain needed where it is installed)
set -euo pipefail
cd "$(dirname "$0")/.."
sdist=0
for a in "$@"; do
  case "$a" in
    --sdist) sdist=1 ;;
    -h|--help) sed -n '2,6p' "$0"; exit 0 ;;
    *) echo "unknown argument $a (see --help)" >&2; exit 2 ;;
  esac
done
venv=${WHEEL_VENV:-$(mktemp -d)/venv}
if [ ! -x "$venv/bin/maturin" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "maturin>=1.5,<2" ziglang
fi
mkdir -p dist
rm -f dist/cgnmt-*.whl dist/cgnmt-*.tar.gz
# The workspace's target directory: the library's dependencies are those the workspace built.
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
PATH="$venv/bin:$PATH" maturin build --release --zig --compatibility manylinux_2_28 \
  -m crates/cgnmt-py/Cargo.toml -o dist
if [ "$sdist" = 1 ]; then
  PATH="$venv/bin:$PATH" maturin sdist -m crates/cgnmt-py/Cargo.toml -o dist
fi
ls -l dist
