"""Medians over the rounds of run.sh: the plain model's and the layer-normalised model's (fused row ops, and
composed ops throughout) training rate, memory and decoding rates."""
import glob
import json
import os
import statistics

here = os.path.dirname(os.path.abspath(__file__))
keys = [
    ("params", "parameters", "{:.0f}"),
    ("train_tgt_tok_per_s", "training, target tok/s", "{:.0f}"),
    ("peak_rss_mib", "peak RSS, MiB", "{:.0f}"),
    ("decode_beam10_sent_per_s", "beam 10, sentences/s", "{:.1f}"),
    ("decode_greedy_sent_per_s", "greedy, sentences/s", "{:.1f}"),
]
names = ["plain", "ln", "ln-reference"]
runs = {v: [json.load(open(p)) for p in sorted(glob.glob(os.path.join(here, f"{v}-[0-9]*.json")))] for v in names}
n = min(len(v) for v in runs.values())
print(f"| measure (median of {n} rounds) | plain, fused | layer norm, fused row ops | layer norm, reference "
      f"| fused row ops / plain | fused row ops / reference |")
print("|---|---|---|---|---|---|")
for key, label, fmt in keys:
    m = {v: statistics.median(r[key] for r in runs[v]) for v in names}
    print(f"| {label} | {fmt.format(m['plain'])} | {fmt.format(m['ln'])} | {fmt.format(m['ln-reference'])} "
          f"| {m['ln'] / m['plain']:.2f} | {m['ln'] / m['ln-reference']:.2f} |")
