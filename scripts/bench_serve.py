#!/usr/bin/env python3
"""Throughput and latency of `cgnmt serve` against `cgnmt translate` on the same sentences.

With wrk installed (Debian's package), wrk drives the load (a C client: its own CPU use does not hide the
server's); the Python clients then run as well, checking that every answer equals `translate`'s (with 2 cores
they are themselves the bottleneck at 64 clients).

Starts the server on 127.0.0.1 (a free port), sends every sentence as its own request from C concurrent
clients (C = 1, 8, 64 by default), and prints, per C: sentences/s, p50 and p99 latency, and the ratio to
`cgnmt translate`'s batch throughput on the same file (its median of --repeats runs). Standard library only.

    scripts/bench_serve.py -m runs/demo/model/best -i test.zh [--limit 500] [--clients 1,8,64] [--repeats 3]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
import urllib.request


def translate_rate(cgnmt, model, path, repeats):
    """`cgnmt translate`'s own decoding rate (its report line: model loading is not counted)."""
    rates = []
    for _ in range(repeats):
        r = subprocess.run([cgnmt, "translate", "-m", model, "-i", path], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        line = [l for l in r.stderr.splitlines() if l.startswith("translated ")][-1]
        rates.append(float(line.split("(")[1].split()[0]))
    return statistics.median(rates)


def start_server(cgnmt, model, extra):
    p = subprocess.Popen([cgnmt, "serve", "-m", model, "--addr", "127.0.0.1:0", "--queue", "100000"] + extra,
                         stderr=subprocess.PIPE, text=True)
    for line in p.stderr:
        if line.startswith("listening on "):
            base = line.split()[2]
            threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
            return p, base
    raise SystemExit("the server exited before listening")


def post(base, sentence):
    req = urllib.request.Request(base + "/v1/translate", data=json.dumps({"sentences": [sentence]}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)["translations"][0]["translation"]


def run_clients(base, sentences, clients):
    lat = [0.0] * len(sentences)
    out = [None] * len(sentences)
    nxt = [0]
    lock = threading.Lock()

    def worker():
        while True:
            with lock:
                k = nxt[0]
                nxt[0] += 1
            if k >= len(sentences):
                return
            t0 = time.perf_counter()
            out[k] = post(base, sentences[k])
            lat[k] = time.perf_counter() - t0

    t0 = time.perf_counter()
    ts = [threading.Thread(target=worker) for _ in range(clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return len(sentences) / (time.perf_counter() - t0), sorted(lat), out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-i", "--input", required=True)
    ap.add_argument("--limit", type=int, default=500)
    ap.add_argument("--clients", default="1,8,64")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=10, help="length of each wrk run")
    ap.add_argument("--cgnmt", default=os.path.join(os.path.dirname(__file__), "..", "target", "release", "cgnmt"))
    a = ap.parse_args()
    with open(a.input, encoding="utf-8") as f:
        sentences = [l.rstrip("\n") for l in f][: a.limit]
    tmp = a.input + ".bench-serve.txt"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("\n".join(sentences) + "\n")
    batch = translate_rate(a.cgnmt, a.model, tmp, a.repeats)
    want = subprocess.run([a.cgnmt, "translate", "--quiet", "-m", a.model, "-i", tmp], check=True,
                          capture_output=True, text=True).stdout.splitlines()
    os.remove(tmp)
    print(f"cgnmt translate: {batch:.1f} sentences/s decoding (median of {a.repeats}; loading not counted)")
    proc, base = start_server(a.cgnmt, a.model, [])
    wrk = shutil.which("wrk")
    try:
        if wrk:
            # wrk (Debian's package) as the load: a C client whose own CPU use is small next to the server's,
            # one sentence a request, connections kept alive. The Python clients below still check answers.
            with open(a.input + ".bench-serve.txt", "w", encoding="utf-8") as f:
                f.write("\n".join(sentences) + "\n")
            lua = os.path.join(os.path.dirname(__file__), "bench_serve.lua")
            for c in [int(x) for x in a.clients.split(",")]:
                rates = []
                for _ in range(a.repeats):
                    r = subprocess.run([wrk, "-t1", f"-c{c}", f"-d{a.seconds}s", "--latency", "-s", lua,
                                        base + "/v1/translate"], check=True, capture_output=True, text=True,
                                       env=dict(os.environ, SENTENCES=a.input + ".bench-serve.txt"))
                    rate = float([l for l in r.stdout.splitlines() if l.startswith("Requests/sec")][0].split()[1])
                    last = [l for l in r.stdout.splitlines() if l.startswith("requests ")][0]
                    rates.append((rate, last))
                rates.sort()
                rate, last = rates[len(rates) // 2]
                print(f"serve (wrk), {c:>3} clients: {rate:7.1f} sentences/s ({rate / batch:.0%} of translate); {last}")
            os.remove(a.input + ".bench-serve.txt")
        for c in [int(x) for x in a.clients.split(",")]:
            rates = []
            for _ in range(a.repeats):
                rate, lat, out = run_clients(base, sentences, c)
                rates.append(rate)
                same = sum(x == y for x, y in zip(out, want))
            rate = statistics.median(rates)
            p50 = lat[len(lat) // 2] * 1000
            p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000
            print(f"serve, {c:>3} clients: {rate:7.1f} sentences/s ({rate / batch:.0%} of translate), "
                  f"p50 {p50:.0f} ms, p99 {p99:.0f} ms, {same}/{len(out)} as translate")
        health = json.load(urllib.request.urlopen(base + "/healthz"))
        print(f"{health['requests']} requests in {health['decode_calls']} decoding calls")
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    sys.exit(main())
