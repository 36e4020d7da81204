"""Durable Store streams through kvcached, one sync per chunk against one group commit per
batch, in the same run: two daemons on SSD (`--durable-store-batch 1` and the default 8),
each fed the same kind of stream — `--chunks` durable chunks of the reference model per
Store call, fresh prefixes every call — by one client, in alternated runs.

    /usr/bin/python3 bench/kvbench/durable_store.py [--seconds 2] [--reps 3] [--chunks 32]
        [--kvcached build/bin/kvcached] [--dir /tmp/kvb-durable] [--json]

Prints GB/s (payload bytes acknowledged durable) and p50/p99 per call for each, and the
ratio. Both daemons' data folders are on the same file system, emptied first.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))

import kvcache  # noqa: E402


def start(binary, folder, batch):
    proc = subprocess.Popen([binary, "--data-dir", folder, "--listen", "127.0.0.1:0",
                             "--ram-bytes", str(256 << 20), "--ssd-bytes", str(4 << 30),
                             "--durable-store-batch", str(batch), "--log-level", "warn",
                             "--shm-socket", "off"], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if "listening on" not in line:
        proc.kill()
        sys.exit(f"kvcached did not start: {line!r}")
    return proc, line.split("listening on ")[1].split(" ")[0]


def run(client, ns, rng, seconds, chunks):
    payload = rng.integers(1, 256, (chunks, ns.chunk_bytes), dtype=np.uint8)
    lat, stored, t0 = [], 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        tokens = rng.integers(0, 256, chunks * ns.chunk_tokens, dtype=np.uint32)
        t = time.perf_counter()
        r = client.store(ns, tokens, payload, durable=True)
        lat.append(time.perf_counter() - t)
        stored += r.stored + r.already_present
    elapsed = time.perf_counter() - t0
    lat.sort()
    return {"gbps": stored * ns.chunk_bytes / elapsed / 1e9, "p50_ms": 1e3 * lat[len(lat) // 2],
            "p99_ms": 1e3 * lat[min(len(lat) - 1, int(0.99 * len(lat)))]}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=2)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--chunks", type=int, default=32)
    p.add_argument("--kvcached", default=os.path.join(ROOT, "build", "bin", "kvcached"))
    p.add_argument("--config", default=os.path.join(ROOT, "configs", "deepseek-v4.1-flash.config.json"))
    p.add_argument("--dir", default="/tmp/kvb-durable")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    shutil.rmtree(a.dir, ignore_errors=True)
    seed = int.from_bytes(os.urandom(8), "little")
    rng = np.random.default_rng(seed)
    daemons, results = {}, {1: [], 8: []}
    try:
        for batch in (1, 8):
            daemons[batch] = start(a.kvcached, os.path.join(a.dir, f"batch-{batch}"), batch)
        clients = {b: kvcache.Client(addr) for b, (_, addr) in daemons.items()}
        config = open(a.config).read()
        nss = {b: c.register_namespace(config, "kvbench-durable") for b, c in clients.items()}
        for _ in range(a.reps):
            for b in (1, 8):
                results[b].append(run(clients[b], nss[b], rng, a.seconds, a.chunks))
    finally:
        for proc, _ in daemons.values():
            proc.terminate()
            proc.wait()

    def median(b, k):
        return float(np.median([r[k] for r in results[b]]))

    out = {"seed": seed, "chunks_per_call": a.chunks, "seconds": a.seconds, "reps": a.reps,
           **{f"batch_{b}": {k: median(b, k) for k in ("gbps", "p50_ms", "p99_ms")} for b in (1, 8)}}
    out["ratio"] = out["batch_8"]["gbps"] / out["batch_1"]["gbps"]
    if a.json:
        print(json.dumps(out))
        return
    print(f"durable Store streams of {a.chunks} reference chunks, one client, {a.reps} x "
          f"{a.seconds} s alternated (medians; seed {seed}):")
    for b in (1, 8):
        r = out[f"batch_{b}"]
        print(f"  --durable-store-batch {b}:  {r['gbps']:.3f} GB/s  p50 {r['p50_ms']:.1f} ms  "
              f"p99 {r['p99_ms']:.1f} ms")
    print(f"  batch 8 / batch 1: {out['ratio']:.2f}")


if __name__ == "__main__":
    main()
