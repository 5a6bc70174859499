"""Median target tokens/s of each run (logged windows after update 20) and the median over the runs."""
import json, pathlib, statistics
here = pathlib.Path(__file__).parent
for kind in ("one", "two"):
    runs = []
    for log in sorted(here.glob(f"{kind}-*.train.log")):
        rows = [json.loads(l) for l in log.read_text().splitlines() if '"step"' in l]
        runs.append(statistics.median(r["tgt_tok_per_s"] for r in rows if r["step"] > 20))
    print(kind, [round(x) for x in runs], "median", round(statistics.median(runs)))
