"""The table of run.sh from its run files: BLEU (runs/bleu-K.txt), the share of constraints met (a phrase is
met when the output's words, stripped of punctuation and compared case-sensitively, contain it), the lines
warned about (runs/test-K.err) and the median decoding time (runs/times.tsv)."""

import re
import statistics
import sys
from pathlib import Path

runs = Path(sys.argv[1])
strip = re.compile(r"^[^\w]+|[^\w]+$")


def words(line):
    return [strip.sub("", w) for w in line.split()]


times = {}
for row in (runs / "times.tsv").read_text().splitlines():
    _, k, t = row.split("\t")
    times.setdefault(k, []).append(float(t))
base = statistics.median(times["0"])
print("| constraints per sentence | sentences with constraints | phrases | in the output as whole words | lines warned (a constraint missed) | BLEU (sacreBLEU 13a) | median time (s) | × unconstrained |")
print("|---|---|---|---|---|---|---|---|")
for k in ("0", "1", "2"):
    hyp = (runs / f"test-{k}.hyp").read_text(encoding="utf-8").splitlines()
    # `cgnmt score`'s sacreBLEU-style line: "BLEU|… = 32.64 …".
    bleu = (runs / f"bleu-{k}.txt").read_text().split(" = ")[1].split()[0]
    warned = sum("could not be met" in l for l in (runs / f"test-{k}.err").read_text(encoding="utf-8").splitlines()) if (runs / f"test-{k}.err").exists() else 0
    if k == "0":
        sents = phrases = met = 0
    else:
        cons = (runs / f"constraints-{k}.tsv").read_text(encoding="utf-8").splitlines()
        sents = sum(1 for c in cons if c)
        phrases = met = 0
        for c, h in zip(cons, hyp):
            hw = " " + " ".join(words(h)) + " "
            for p in (c.split("\t") if c else []):
                phrases += 1
                met += (" " + p + " ") in hw
    med = statistics.median(times[k])
    share = f"{met}/{phrases} ({100 * met / phrases:.1f}%)" if phrases else "—"
    print(f"| {k} | {sents if k != '0' else '—'} | {phrases if k != '0' else '—'} | {share} | {warned} | {bleu} | {med:.1f} | {med / base:.2f} |")
