"""Medians and ranges over the rounds of run.sh: the layer-normalised model before (OLD) and after (NEW) its
encoder runs the fused op that normalises inside, and the plain model's figures from ../bench for scale.
Decoding is compared per hypothesis step: an untrained model's hypotheses run to different lengths, so
sentences/s depend on what the weights happen to emit (the two builds decode the same hypotheses here)."""
import glob
import json
import os
import statistics

here = os.path.dirname(os.path.abspath(__file__))
keys = [
    ("train_tgt_tok_per_s", "training, target tok/s", "{:.0f}"),
    ("peak_rss_mib", "peak RSS, MiB", "{:.0f}"),
    ("decode_beam10_hyp_steps_per_s", "beam 10, hypothesis steps/s", "{:.0f}"),
    ("decode_beam10_hyp_steps", "beam 10, hypothesis steps (100 sentences)", "{:.0f}"),
    ("decode_beam10_sent_per_s", "beam 10, sentences/s", "{:.1f}"),
    ("decode_greedy_hyp_steps_per_s", "greedy, steps/s", "{:.0f}"),
]


def load(d, v):
    return [json.load(open(p)) for p in sorted(glob.glob(os.path.join(d, f"{v}-[0-9]*.json")))]


runs = {v: load(here, v) for v in ["old", "new"]}
plain = load(os.path.join(here, "..", "bench"), "plain")
n = min(len(v) for v in runs.values())
print(f"| measure (median of {n} alternated rounds) | layer norm, before | layer norm, after | after / before "
      f"(range over rounds) | plain model ({len(plain)} rounds, ../bench) | after / plain |")
print("|---|---|---|---|---|---|")
for key, label, fmt in keys:
    m = {v: statistics.median(r[key] for r in runs[v]) for v in runs}
    ratios = [b[key] / a[key] for a, b in zip(runs["old"], runs["new"])]
    p = statistics.median(r[key] for r in plain)
    print(f"| {label} | {fmt.format(m['old'])} | {fmt.format(m['new'])} | {m['new'] / m['old']:.2f} "
          f"({min(ratios):.2f}–{max(ratios):.2f}) | {fmt.format(p)} | {m['new'] / p:.2f} |")
