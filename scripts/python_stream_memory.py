"""Memory of `Translator.translate_iterable` over a long stream: translates N sentences (the lines of INPUT,
cycled) from a generator, reading the process's resident memory (VmRSS) every EVERY results, and writes the
curve and its summary as JSON. Flat memory means the stream is held a chunk at a time, not whole.

    python scripts/python_stream_memory.py MODEL_DIR INPUT OUT.json [--lines 1000000] [--every 50000]
        [--beam 1] [--max-batch-size 32]
"""

import argparse
import itertools
import json
import resource
import sys
import time

import cgnmt


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("input")
    p.add_argument("out")
    p.add_argument("--lines", type=int, default=1_000_000)
    p.add_argument("--every", type=int, default=50_000)
    p.add_argument("--beam", type=int, default=1)
    p.add_argument("--max-batch-size", type=int, default=32)
    a = p.parse_args()
    with open(a.input, encoding="utf-8") as f:
        lines = [l for l in f.read().splitlines() if l.strip()]
    tr = cgnmt.Translator(a.model)
    source = itertools.islice(itertools.cycle(lines), a.lines)
    start = time.perf_counter()
    curve = [{"results": 0, "rss_mib": round(rss_mib(), 1), "seconds": 0.0}]
    n = tokens = 0
    for r in tr.translate_iterable(source, max_batch_size=a.max_batch_size, beam_size=a.beam):
        n += 1
        tokens += len(r.hypotheses[0])
        if n % a.every == 0:
            curve.append({"results": n, "rss_mib": round(rss_mib(), 1),
                          "seconds": round(time.perf_counter() - start, 1)})
            print(f"{n} results, {curve[-1]['rss_mib']} MiB", file=sys.stderr, flush=True)
    if n != a.lines:
        raise SystemExit(f"{n} results for {a.lines} lines")
    after_first = [c["rss_mib"] for c in curve[2:]] or [curve[-1]["rss_mib"]]
    record = {
        "command": " ".join(sys.argv),
        # The extension's own version and commit (the build measured, whatever the checkout holds now).
        "version": cgnmt._cgnmt.__version__,
        "model": a.model,
        "lines": a.lines,
        "beam": a.beam,
        "max_batch_size": a.max_batch_size,
        "output_tokens": tokens,
        "seconds": round(time.perf_counter() - start, 1),
        "rss_mib_first_checkpoint": curve[1]["rss_mib"] if len(curve) > 1 else None,
        "rss_mib_max_after_first_checkpoint": max(after_first),
        "rss_mib_growth_after_first_checkpoint": round(max(after_first) - curve[1]["rss_mib"], 1) if len(curve) > 1 else None,
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "curve": curve,
    }
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    print(json.dumps({k: v for k, v in record.items() if k != "curve"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
