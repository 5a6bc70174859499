#!/usr/bin/env bash
# Figures of a built wheel (dist/cgnmt-*.whl, from scripts/build_wheel.sh): its size and its extension module's,
# a fresh `pip install` into a new virtual environment with no cargo on PATH (seconds, numpy included), and
# `import cgnmt` (median of 5 runs of `python -X importtime`, microseconds, numpy included and numpy alone);
# with dist/cgnmt-*.tar.gz (`build_wheel.sh --sdist`), the sdist's size and file count.
# Usage (repository root): bash scripts/wheel_figures.sh OUT.json
set -euo pipefail
out=${1:?usage: scripts/wheel_figures.sh OUT.json}
whl=$(ls dist/cgnmt-*.whl)
venv=$(mktemp -d)/venv
python3 -m venv "$venv"
start=$(date +%s.%N)
env PATH="$venv/bin:/usr/bin:/bin" "$venv/bin/pip" install -q "$whl"
end=$(date +%s.%N)
cargo_seen=$(env PATH="$venv/bin:/usr/bin:/bin" bash -c 'command -v cargo || echo none')
imports=$(for _ in 1 2 3 4 5; do "$venv/bin/python" -X importtime -c "import cgnmt" 2>&1 | awk -F'|' '/ cgnmt$/ {gsub(/ /, "", $2); print $2}'; done | sort -n | sed -n 3p)
numpy=$(for _ in 1 2 3 4 5; do "$venv/bin/python" -X importtime -c "import numpy" 2>&1 | awk -F'|' '/ numpy$/ {gsub(/ /, "", $2); print $2}'; done | sort -n | sed -n 3p)
so=$(unzip -l "$whl" | awk '/_cgnmt.abi3.so/ {print $1}')
sdist=$(ls dist/cgnmt-*.tar.gz 2>/dev/null || true)
python3 - "$out" "$whl" "$so" "$start" "$end" "$cargo_seen" "$imports" "$numpy" "$sdist" <<'PY'
import json, os, sys, tarfile
out, whl, so, start, end, cargo, imp, numpy, sdist = sys.argv[1:]
rec = {
    "wheel": os.path.basename(whl),
    "wheel_bytes": os.path.getsize(whl),
    "extension_module_bytes": int(so),
    "fresh_install_seconds": round(float(end) - float(start), 2),
    "cargo_on_path_during_install": cargo,
    "import_cgnmt_us_median_of_5": int(imp),
    "import_numpy_alone_us_median_of_5": int(numpy),
}
if sdist:
    with tarfile.open(sdist) as t:
        names = [m.name for m in t.getmembers() if m.isfile()]
    rec["sdist"] = os.path.basename(sdist)
    rec["sdist_bytes"] = os.path.getsize(sdist)
    rec["sdist_files"] = len(names)
    rec["sdist_has_results_tests_or_target"] = any(
        f"/{d}/" in n for n in names for d in ("results", "tests", "target")
    )
json.dump(rec, open(out, "w"), indent=1)
print(json.dumps(rec))
PY
