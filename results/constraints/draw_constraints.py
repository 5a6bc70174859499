"""Draw terminology constraints from reference translations as Post & Vilar (2018) did: per sentence, 1 or 2
phrases of 1-3 consecutive words of its reference, not overlapping, chosen at random (seed 2018). Words are
the reference's whitespace tokens stripped of surrounding punctuation; a phrase is drawn only from words
that occur in the training targets (so that the model's subwords can spell it). Writes constraints-1.tsv and
constraints-2.tsv (one line per sentence, phrases separated by tabs, empty when the reference is too short)."""

import random
import re
import sys
from pathlib import Path

train, test, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
strip = re.compile(r"^[^\w]+|[^\w]+$")
known = set()
for line in train.read_text(encoding="utf-8").splitlines():
    known.update(strip.sub("", w) for w in line.split())
refs = test.read_text(encoding="utf-8").splitlines()
for n in (1, 2):
    rng = random.Random(2018 + n)
    lines = []
    for ref in refs:
        words = [strip.sub("", w) for w in ref.split()]
        # Runs of usable words (known, not emptied by stripping), as candidate spans.
        spans = []
        for i in range(len(words)):
            for ln in (1, 2, 3):
                seg = words[i:i + ln]
                if len(seg) == ln and all(w and w in known for w in seg):
                    spans.append((i, ln))
        rng.shuffle(spans)
        chosen = []
        for i, ln in spans:
            if len(chosen) == n:
                break
            if all(i + ln <= j or j + m <= i for j, m in chosen):
                chosen.append((i, ln))
        lines.append("\t".join(" ".join(words[i:i + ln]) for i, ln in sorted(chosen)))
    (out / f"constraints-{n}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
