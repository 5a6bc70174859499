"""Medians over the rounds of run.sh (rounds.txt): decoder rows (hypothesis steps) per second of PyTorch eager's
batched beam and of cgnmt's beam 10 with the deep model, their ratio, and cgnmt's sentences per second."""
import os
import re
import statistics

here = os.path.dirname(os.path.abspath(__file__))
rows = [re.findall(r"[0-9.]+", line) for line in open(os.path.join(here, "rounds.txt")) if line.startswith("round")]
cols = {"torch": 1, "cgnmt": 2, "ratio": 3, "sent": 5}
v = {k: [float(r[i]) for r in rows] for k, i in cols.items()}
print(f"| small-deep, beam 10, {len(rows)} alternated rounds | median | range |")
print("|---|---|---|")
print(f"| PyTorch eager, hypothesis steps/s | {statistics.median(v['torch']):.0f} | {min(v['torch']):.0f}–{max(v['torch']):.0f} |")
print(f"| cgnmt, hypothesis steps/s | {statistics.median(v['cgnmt']):.0f} | {min(v['cgnmt']):.0f}–{max(v['cgnmt']):.0f} |")
print(f"| cgnmt / PyTorch | {statistics.median(v['ratio']):.2f} | {min(v['ratio']):.2f}–{max(v['ratio']):.2f} |")
print(f"| cgnmt, sentences/s | {statistics.median(v['sent']):.1f} | {min(v['sent']):.1f}–{max(v['sent']):.1f} |")
