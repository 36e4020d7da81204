"""Durable Store streams through kvcached against fio on the same disk, in the same run.

Three daemons on SSD, each fed the same kind of stream — `--chunks` durable chunks of the
reference model per Store call, fresh prefixes every call — by one client:
- `sync-each`: `--durable-store-batch 1 --durable-store-in-flight 1`, a sync per chunk;
- `batch-serial`: batches of 8 (one group commit each), one batch written at a time;
- `batch-pipelined`: the defaults, batches of 8 with 2 in flight (the next batch read and
  written while the previous one's sync runs).
`memory-store` is the last daemon fed memory-durability streams: no disk in the way, so what
one client's stream can move at all (client, gRPC, the server's CPU) — the bound of the rest.
Peers, at io depth 8 with writes of one slot (229,376 B), O_DIRECT, io_uring, on a file
as large as a daemon's SSD tier: `fio` (one fdatasync per 8 writes, queued beside the next
writes: the device's pipelined best) and `fio-sync-each` (8 jobs, a sync after each write:
what a store that acknowledges each write after its own sync can do).

    /usr/bin/python3 bench/kvbench/durable_store.py [--seconds 2] [--reps 3] [--chunks 32]
        [--kvcached build/bin/kvcached] [--dir /tmp/kvb-durable] [--no-fio] [--json]

Prints GB/s (payload bytes acknowledged durable; fio's scaled to payload bytes) and p50/p99
per call (per write for fio), medians of alternated runs, and the ratios. Everything lives
in --dir, emptied first.
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


SSD_BYTES = 4 << 30
SLOT_BYTES = 229376  # a reference chunk's slot: header and payload, in 4 KiB pages
DAEMONS = {"sync-each": (1, 1), "batch-serial": (8, 1), "batch-pipelined": (8, 2)}
FIO = {"fio": "--iodepth=8 --fdatasync=8",
       "fio-sync-each": "--numjobs=8 --iodepth=1 --fdatasync=1 --group_reporting"}


def start(binary, folder, batch, in_flight):
    proc = subprocess.Popen([binary, "--data-dir", folder, "--listen", "127.0.0.1:0",
                             "--ram-bytes", str(256 << 20), "--ssd-bytes", str(SSD_BYTES),
                             "--durable-store-batch", str(batch),
                             "--durable-store-in-flight", str(in_flight), "--log-level", "warn",
                             "--shm-socket", "off"], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if "listening on" not in line:
        proc.kill()
        sys.exit(f"kvcached did not start: {line!r}")
    return proc, line.split("listening on ")[1].split(" ")[0]


def run(client, ns, rng, seconds, chunks, durable=True):
    payload = rng.integers(1, 256, (chunks, ns.chunk_bytes), dtype=np.uint8)
    lat, stored, t0 = [], 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        tokens = rng.integers(0, 256, chunks * ns.chunk_tokens, dtype=np.uint32)
        t = time.perf_counter()
        r = client.store(ns, tokens, payload, durable=durable)
        lat.append(time.perf_counter() - t)
        stored += r.stored + r.already_present
    elapsed = time.perf_counter() - t0
    lat.sort()
    return {"gbps": stored * ns.chunk_bytes / elapsed / 1e9, "p50_ms": 1e3 * lat[len(lat) // 2],
            "p99_ms": 1e3 * lat[min(len(lat) - 1, int(0.99 * len(lat)))]}


def run_fio(folder, shape, seconds, chunk_bytes):
    cmd = (f"fio --name=durable --filename={folder}/fio.dat --size={SSD_BYTES // 2} "
           f"--bs={SLOT_BYTES} --rw=randwrite --ioengine=io_uring --direct=1 {shape} "
           f"--runtime={seconds} --time_based --norandommap --randrepeat=0 --fixedbufs "
           f"--registerfiles --output-format=json --eta=never")
    out = subprocess.run(cmd.split(), capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"fio failed: {out.stderr[:300]}")
    w = json.loads(out.stdout[out.stdout.index("{"):])["jobs"][0]["write"]
    pct = w["clat_ns"]["percentile"]
    return {"gbps": w["io_bytes"] * chunk_bytes / SLOT_BYTES / (w["runtime"] / 1e3) / 1e9,
            "p50_ms": pct["50.000000"] / 1e6, "p99_ms": pct["99.000000"] / 1e6}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=2)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--chunks", type=int, default=32)
    p.add_argument("--kvcached", default=os.path.join(ROOT, "build", "bin", "kvcached"))
    p.add_argument("--config", default=os.path.join(ROOT, "configs", "deepseek-v4.1-flash.config.json"))
    p.add_argument("--dir", default="/tmp/kvb-durable")
    p.add_argument("--no-fio", action="store_true", help="leave the fio peers out")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    shutil.rmtree(a.dir, ignore_errors=True)
    os.makedirs(a.dir)
    seed = int.from_bytes(os.urandom(8), "little")
    rng = np.random.default_rng(seed)
    peers = {} if a.no_fio or shutil.which("fio") is None else FIO
    daemons, results = {}, {name: [] for name in [*DAEMONS, "memory-store", *peers]}
    try:
        for name, (batch, in_flight) in DAEMONS.items():
            daemons[name] = start(a.kvcached, os.path.join(a.dir, name), batch, in_flight)
        clients = {n: kvcache.Client(addr) for n, (_, addr) in daemons.items()}
        config = open(a.config).read()
        nss = {n: c.register_namespace(config, "kvbench-durable") for n, c in clients.items()}
        chunk_bytes = next(iter(nss.values())).chunk_bytes
        for _ in range(a.reps):
            for n in DAEMONS:
                results[n].append(run(clients[n], nss[n], rng, a.seconds, a.chunks))
            # The same stream without the disk: what the client, gRPC and the server's CPU
            # allow one stream, the bound of every durable row.
            results["memory-store"].append(run(clients["batch-pipelined"], nss["batch-pipelined"],
                                               rng, a.seconds, a.chunks, durable=False))
            for n, shape in peers.items():
                results[n].append(run_fio(a.dir, shape, a.seconds, chunk_bytes))
    finally:
        for proc, _ in daemons.values():
            proc.terminate()
            proc.wait()
        shutil.rmtree(a.dir, ignore_errors=True)

    def median(n, k):
        return float(np.median([r[k] for r in results[n]]))

    out = {"seed": seed, "chunks_per_call": a.chunks, "seconds": a.seconds, "reps": a.reps,
           **{n: {k: median(n, k) for k in ("gbps", "p50_ms", "p99_ms")} for n in results}}
    ratios = {"batch-pipelined / batch-serial": ("batch-pipelined", "batch-serial"),
              "batch-pipelined / sync-each": ("batch-pipelined", "sync-each"),
              "batch-pipelined / memory-store": ("batch-pipelined", "memory-store")}
    if peers:
        ratios["batch-pipelined / fio"] = ("batch-pipelined", "fio")
        ratios["batch-pipelined / fio-sync-each"] = ("batch-pipelined", "fio-sync-each")
    out["ratios"] = {k: out[x]["gbps"] / out[y]["gbps"] for k, (x, y) in ratios.items()}
    if a.json:
        print(json.dumps(out))
        return
    print(f"durable Store streams of {a.chunks} reference chunks, one client, {a.reps} x "
          f"{a.seconds} s alternated (medians; seed {seed}):")
    for n in results:
        r = out[n]
        print(f"  {n:16s} {r['gbps']:.3f} GB/s  p50 {r['p50_ms']:.2f} ms  p99 {r['p99_ms']:.2f} ms")
    for k, v in out["ratios"].items():
        print(f"  {k}: {v:.2f}")


if __name__ == "__main__":
    main()
