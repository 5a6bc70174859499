"""Medians over the rounds of run.sh: the one-layer and the deep model's training rate, FLOP rate and share of
the SGEMM peak measured between steps, and beam search's rate."""
import glob
import json
import os
import statistics

here = os.path.dirname(os.path.abspath(__file__))
keys = [
    ("params", "parameters", "{:.0f}"),
    ("train_tgt_tok_per_s", "training, target tok/s", "{:.0f}"),
    ("gflops_per_s", "training, GFLOP/s", "{:.1f}"),
    ("peak_fraction_between_steps", "training, share of the SGEMM peak between steps", "{:.2f}"),
    ("decode_beam10_sent_per_s", "beam 10, sentences/s", "{:.1f}"),
    ("decode_beam10_gflops_per_s", "beam 10, GFLOP/s", "{:.1f}"),
]
runs = {}
for size in ["small", "small-deep"]:
    runs[size] = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(here, f"{size}-[0-9]*.json")))]
n = min(len(v) for v in runs.values())
print(f"| measure (median of {n} rounds) | small | small-deep | deep / one-layer |")
print("|---|---|---|---|")
for key, label, fmt in keys:
    a = statistics.median(r[key] for r in runs["small"])
    b = statistics.median(r[key] for r in runs["small-deep"])
    print(f"| {label} | {fmt.format(a)} | {fmt.format(b)} | {b / a:.2f} |")
