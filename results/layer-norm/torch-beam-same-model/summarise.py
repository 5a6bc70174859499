"""Medians over the rounds of run.sh (rounds.txt in this folder, or in the folder given): PyTorch eager's and
cgnmt's beam-10 sentences/s over the same model, their ratio, and how many translations were the same."""
import os
import re
import statistics
import sys

here = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
rows = [re.findall(r"[0-9.]+", line) for line in open(os.path.join(here, "rounds.txt")) if line.startswith("round")]
torch = [float(r[1]) for r in rows]
cgnmt = [float(r[2]) for r in rows]
ratio = [float(r[3]) for r in rows]
same = [int(r[4]) for r in rows]
model = open(os.path.join(here, "model.txt")).read().strip()
print(f"{model}\n")
print(f"| beam 10 over the same model, 2,049 sentences, {len(rows)} alternated rounds | median | range |")
print("|---|---|---|")
print(f"| PyTorch eager, sentences/s | {statistics.median(torch):.1f} | {min(torch):.1f}–{max(torch):.1f} |")
print(f"| cgnmt translate, sentences/s | {statistics.median(cgnmt):.1f} | {min(cgnmt):.1f}–{max(cgnmt):.1f} |")
print(f"| cgnmt / PyTorch | {statistics.median(ratio):.2f} | {min(ratio):.2f}–{max(ratio):.2f} |")
print(f"| translations the same as cgnmt's | {min(same)} of 2049 in every round | |")
