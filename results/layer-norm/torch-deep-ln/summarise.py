"""Medians over the rounds of run.sh (rounds.txt in this folder, or in the folder given: torch-deep-paused, 7316351): PyTorch eager's and cgnmt's target tokens/s on the same batch,
their ratio, and cgnmt's share of the SGEMM peak measured between its steps."""
import os
import re
import statistics

here = os.path.dirname(os.path.abspath(__file__))
import sys
here = sys.argv[1] if len(sys.argv) > 1 else here
rows = [re.findall(r"[0-9.]+", line) for line in open(os.path.join(here, "rounds.txt")) if line.startswith("round")]
torch = [float(r[1]) for r in rows]
cgnmt = [float(r[2]) for r in rows]
ratio = [float(r[3]) for r in rows]
peak = [float(r[4]) for r in rows]
# (Layer-normalised or not, as the PyTorch runs' configuration says.)
first = open(os.path.join(here, "torch-1.txt")).read()
size = "paper-deep" if "cfg=paper-deep" in first else "small-deep"
normed = f"cfg={size}-ln" in first
what = f"{size} layer-normalised training" if normed else f"{size} training"
print(f"| {what}, {len(rows)} alternated rounds | median | range |")
print("|---|---|---|")
print(f"| PyTorch eager, target tok/s | {statistics.median(torch):.0f} | {min(torch):.0f}–{max(torch):.0f} |")
print(f"| cgnmt, target tok/s | {statistics.median(cgnmt):.0f} | {min(cgnmt):.0f}–{max(cgnmt):.0f} |")
print(f"| cgnmt / PyTorch | {statistics.median(ratio):.2f} | {min(ratio):.2f}–{max(ratio):.2f} |")
print(f"| cgnmt's share of the SGEMM peak between steps | {statistics.median(peak):.2f} | {min(peak):.2f}–{max(peak):.2f} |")
# With OLD (run.sh), the other build's rate and share in the same rounds.
if len(rows[0]) >= 7:
    old = [float(r[5]) for r in rows]
    old_peak = [float(r[6]) for r in rows]
    print(f"| the other build (OLD), target tok/s | {statistics.median(old):.0f} | {min(old):.0f}–{max(old):.0f} |")
    print(f"| the other build's share of the SGEMM peak | {statistics.median(old_peak):.2f} | "
          f"{min(old_peak):.2f}–{max(old_peak):.2f} |")
    gain = [c / o for c, o in zip(cgnmt, old)]
    print(f"| cgnmt / the other build, round by round | {statistics.median(gain):.2f} | {min(gain):.2f}–{max(gain):.2f} |")
