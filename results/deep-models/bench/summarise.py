"""The medians of the alternated runs of run.sh, and the median of each round's paired ratio new / old."""
import glob
import json
import os
import statistics

here = os.path.dirname(os.path.abspath(__file__))
keys = [
    ("train_tgt_tok_per_s", "training, target tok/s"),
    ("decode_beam10_sent_per_s", "beam 10, sentences/s"),
    ("decode_greedy_sent_per_s", "greedy, sentences/s"),
]
runs = {}
for path in glob.glob(os.path.join(here, "*-*.json")):
    side, r = os.path.basename(path)[:-5].split("-")
    with open(path) as f:
        runs[(side, int(r))] = json.load(f)
rounds = sorted({r for (_, r) in runs if ("old", r) in runs and ("new", r) in runs})
print(f"| measure | old (median of {len(rounds)}) | new (median) | new / old, paired (per round) |")
print("|---|---|---|---|")
for key, label in keys:
    old = [runs[("old", r)][key] for r in rounds]
    new = [runs[("new", r)][key] for r in rounds]
    ratios = [n / o for n, o in zip(new, old)]
    per = ", ".join(f"{x:.3f}" for x in ratios)
    print(
        f"| {label} | {statistics.median(old):.1f} | {statistics.median(new):.1f} | "
        f"**{statistics.median(ratios):.3f}** ({per}) |"
    )
