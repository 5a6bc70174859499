"""The table of an alternated benchmark (scripts/bench_pair.sh): per measure, the medians of the old and new
builds' runs and the median of each round's paired ratio new / old, with every round's ratio.

Usage: python3 scripts/bench_summary.py DIR   (DIR holds old-R.json and new-R.json; prints Markdown)
"""
import glob
import json
import os
import statistics
import sys

KEYS = [
    ("train_tgt_tok_per_s", "training, target tok/s"),
    ("decode_beam10_sent_per_s", "beam 10, sentences/s"),
    ("decode_greedy_sent_per_s", "greedy, sentences/s"),
]


def main(folder):
    runs = {}
    for path in glob.glob(os.path.join(folder, "*-*.json")):
        side, r = os.path.basename(path)[:-5].split("-")
        with open(path) as f:
            runs[(side, int(r))] = json.load(f)
    rounds = sorted({r for (_, r) in runs if ("old", r) in runs and ("new", r) in runs})
    if not rounds:
        sys.exit(f"{folder}: no round with both an old-R.json and a new-R.json")
    print(f"| measure | old (median of {len(rounds)}) | new (median) | new / old, paired (per round) |")
    print("|---|---|---|---|")
    for key, label in KEYS:
        old = [runs[("old", r)][key] for r in rounds]
        new = [runs[("new", r)][key] for r in rounds]
        ratios = [n / o for n, o in zip(new, old)]
        per = ", ".join(f"{x:.3f}" for x in ratios)
        print(
            f"| {label} | {statistics.median(old):.1f} | {statistics.median(new):.1f} | "
            f"**{statistics.median(ratios):.3f}** ({per}) |"
        )


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python3 scripts/bench_summary.py DIR")
    main(sys.argv[1])
