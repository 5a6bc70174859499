"""Translate a file with a cgnmt model: one output line per input line (an empty line stays empty).

    python examples/python/translate_file.py MODEL_DIR INPUT OUTPUT [--beam 10] [--length-penalty A]
        [--coverage-penalty B] [--int8] [--batch 32]
"""

import argparse
import sys
import time

import cgnmt


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", help="model directory (a run directory means its best/ model)")
    p.add_argument("input")
    p.add_argument("output")
    p.add_argument("--beam", type=int, default=10)
    p.add_argument("--length-penalty", type=float, default=None)
    p.add_argument("--coverage-penalty", type=float, default=None)
    p.add_argument("--int8", action="store_true")
    p.add_argument("--batch", type=int, default=32)
    a = p.parse_args()
    with open(a.input, encoding="utf-8") as f:
        lines = f.read().splitlines()
    tr = cgnmt.Translator(a.model, int8=a.int8)
    for note in tr.notes:
        print(f"warning: {note}", file=sys.stderr)
    t0 = time.monotonic()
    out = tr.translate(
        lines,
        beam=a.beam,
        length_penalty=a.length_penalty,
        coverage_penalty=a.coverage_penalty,
        batch=a.batch,
    )
    secs = time.monotonic() - t0
    with open(a.output, "w", encoding="utf-8") as f:
        f.writelines(t.text + "\n" for t in out)
    print(f"translated {len(lines)} lines in {secs:.1f} s ({len(lines) / max(secs, 1e-9):.1f} sentences/s)",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
