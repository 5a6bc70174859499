"""Medians and ranges over the rounds of run.sh (old and new build): training rate, the share of the SGEMM peak
between steps, peak memory. Reads the runs of this folder, or of the folder given."""
import glob
import json
import os
import statistics
import sys

here = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
runs = {v: [json.load(open(p)) for p in sorted(glob.glob(os.path.join(here, f"{v}-[0-9]*.json")))] for v in ["old", "new"]}
n = min(len(r) for r in runs.values())
print(f"| small-deep + layer norm, {n} alternated rounds | old: median (range) | new: median (range) | new / old |")
print("|---|---|---|---|")
for key, label, fmt in [
    ("train_tgt_tok_per_s", "training, target tok/s", "{:.0f}"),
    ("peak_fraction_between_steps", "share of the SGEMM peak between steps", "{:.3f}"),
    ("peak_rss_mib", "peak RSS, MiB", "{:.0f}"),
]:
    cell = {}
    for v in ["old", "new"]:
        xs = [r[key] for r in runs[v][:n]]
        cell[v] = (statistics.median(xs), min(xs), max(xs))
    f = lambda c: f"{fmt.format(c[0])} ({fmt.format(c[1])}–{fmt.format(c[2])})"
    print(f"| {label} | {f(cell['old'])} | {f(cell['new'])} | {cell['new'][0] / cell['old'][0]:.2f} |")
ratios = [runs["new"][i]["train_tgt_tok_per_s"] / runs["old"][i]["train_tgt_tok_per_s"] for i in range(n)]
print(f"| training, new / old round by round | | | {statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f}) |")
