"""Decoding speed of the Python package against the command line, alternated: each round translates the same
file with `cgnmt translate` (its own timing of the decoding, printed on standard error) and with
`cgnmt.Translator.translate` in this process (the call's wall time), and prints both sentences/s, the
per-round ratio Python / CLI and the medians. Model loading is not timed on either side.

    python scripts/python_speed.py CGNMT_BIN MODEL_DIR INPUT [--rounds 7] [--beam 10] [--batch 32]
"""

import argparse
import re
import statistics
import subprocess
import sys
import time

import cgnmt


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cgnmt_bin")
    p.add_argument("model")
    p.add_argument("input")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--beam", type=int, default=10)
    p.add_argument("--batch", type=int, default=32)
    a = p.parse_args()
    with open(a.input, encoding="utf-8") as f:
        lines = f.read().splitlines()
    tr = cgnmt.Translator(a.model)
    tr.translate(lines[:64], beam=a.beam, batch=a.batch)  # warm up
    print(f"{len(lines)} sentences, beam {a.beam}, batch {a.batch}, {a.rounds} rounds; {cgnmt._cgnmt.__version__}")
    print("| round | cgnmt translate, sent/s | Python, sent/s | Python / CLI |")
    print("|---|---|---|---|")
    cli_rates, py_rates, ratios = [], [], []
    for r in range(1, a.rounds + 1):
        out = subprocess.run(
            [a.cgnmt_bin, "translate", "-m", a.model, "-i", a.input, "-o", "/dev/null",
             "--beam", str(a.beam), "--batch", str(a.batch)],
            capture_output=True, text=True, timeout=1800, check=True,
        )
        m = re.search(r"\(([0-9.]+) sentences/s", out.stderr)
        if not m:
            print(out.stderr, file=sys.stderr)
            return 1
        cli = float(m.group(1))
        t0 = time.monotonic()
        tr.translate(lines, beam=a.beam, batch=a.batch)
        py = len(lines) / (time.monotonic() - t0)
        cli_rates.append(cli)
        py_rates.append(py)
        ratios.append(py / cli)
        print(f"| {r} | {cli:.1f} | {py:.1f} | {py / cli:.3f} |", flush=True)
    print(
        f"| median | {statistics.median(cli_rates):.1f} | {statistics.median(py_rates):.1f} | "
        f"**{statistics.median(ratios):.3f}** |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
