"""The context gate over a test set, one CSV row per sentence (no pandas needed): the sentence's length, its
output's length, the mean, smallest and largest gate value over its output words, and (with references) its
sentence BLEU — the material of the paper's Table 6.

    python examples/python/gate_stats.py MODEL_DIR TEST.src [TEST.ref] OUT.csv [--beam 10]
"""

import argparse
import csv
import sys

import numpy as np

import cgnmt
from cgnmt import metrics


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("src")
    p.add_argument("files", nargs="+", help="[REF] OUT.csv")
    p.add_argument("--beam", type=int, default=10)
    a = p.parse_args()
    if len(a.files) > 2:
        p.error("give at most a reference file and the output file")
    ref_path, out_path = (a.files[0], a.files[1]) if len(a.files) == 2 else (None, a.files[0])
    with open(a.src, encoding="utf-8") as f:
        src = f.read().splitlines()
    refs = None
    if ref_path:
        with open(ref_path, encoding="utf-8") as f:
            refs = f.read().splitlines()
        if len(refs) != len(src):
            p.error(f"{ref_path}: {len(refs)} lines, the source {len(src)}")
    tr = cgnmt.Translator(a.model)
    out = tr.translate(src, beam=a.beam, return_gates=True)
    with open(out_path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["line", "source_tokens", "output_tokens", "mean_gate", "min_gate", "max_gate", "sentence_bleu"])
        means = []
        for i, t in enumerate(out):
            g = t.gates
            stats = [f"{g.mean():.4f}", f"{g.min():.4f}", f"{g.max():.4f}"] if len(g) else ["", "", ""]
            if len(g):
                means.append(g.mean())
            bleu = f"{metrics.bleu([t.text], [[refs[i]]]).score:.2f}" if refs else ""
            w.writerow([i + 1, len(t.source_tokens), len(t.tokens), *stats, bleu])
    if means:
        print(f"{len(out)} sentences; mean gate {np.mean(means):.3f} (sd {np.std(means):.3f}) → {out_path}")
    else:
        print(f"{len(out)} sentences; this model has no context gate → {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
