"""Medians over the rounds of run.sh: the plain model's, and the layer-normalised model's before (the fused row ops
inside the composed recurrence) and with the fused encoder and decoder ops that normalise inside: training rate,
memory and decoding rates. (Decoding compares per hypothesis step: an untrained model's hypotheses run to
lengths that depend on its weights, and the layer-normalised model's run longer.) Reads the runs of this folder,
or of the folder given (fused-ops-cgru)."""
import glob
import json
import os
import statistics
import sys

here = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
keys = [
    ("params", "parameters", "{:.0f}"),
    ("train_tgt_tok_per_s", "training, target tok/s", "{:.0f}"),
    ("peak_rss_mib", "peak RSS, MiB", "{:.0f}"),
    ("decode_beam10_sent_per_s", "beam 10, sentences/s", "{:.1f}"),
    ("decode_greedy_sent_per_s", "greedy, sentences/s", "{:.1f}"),
]
names = ["plain", "ln-before", "ln"]
runs = {v: [json.load(open(p)) for p in sorted(glob.glob(os.path.join(here, f"{v}-[0-9]*.json")))] for v in names}
n = min(len(v) for v in runs.values())
keys.insert(4, ("decode_beam10_hyp_steps_per_s", "beam 10, hypothesis steps/s", "{:.0f}"))
keys.append(("decode_greedy_hyp_steps_per_s", "greedy, steps/s", "{:.0f}"))
print(f"| measure (median of {n} alternated rounds) | plain | layer norm, before (fused row ops) | layer norm, fused ops "
      f"| fused ops / plain | fused ops / before |")
print("|---|---|---|---|---|---|")
for key, label, fmt in keys:
    m = {v: statistics.median(r[key] for r in runs[v]) for v in names}
    print(f"| {label} | {fmt.format(m['plain'])} | {fmt.format(m['ln-before'])} | {fmt.format(m['ln'])} "
          f"| {m['ln'] / m['plain']:.2f} | {m['ln'] / m['ln-before']:.2f} |")
