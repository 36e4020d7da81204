"""The Python client's Lookup of a long cached prefix (the planners' 1M tokens), timed call
by call against a kvcached it starts itself, in three ways in the same run:

  tokens, native hashing   lookup(tokens): the keys hashed in one native call
                           (libkvcache_hash.so), then one Lookup of the packed keys
  tokens, Python hashing   the same with the package's Python loop (the peer: what a client
                           without the library pays)
  kept keys                lookup_keys(keys): a worker that kept last turn's keys

    /usr/bin/python3 bench/kvbench/python_lookup.py [--tokens 1000000] [--calls 300]
        [--kvcached build/bin/kvcached] [--config configs/mini.json] [--json]

The prefix is stored first (the mini model's chunks: the Lookup's cost does not depend on the
chunk's bytes, only on how many chunks there are). Prints p50/p99 per way and each's ratio
to the Python-hashing peer.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))

import kvcache  # noqa: E402
from kvcache import hashing  # noqa: E402


def start_daemon(binary, folder):
    proc = subprocess.Popen([binary, "--data-dir", folder, "--listen", "127.0.0.1:0",
                             "--ram-bytes", str(1 << 30), "--ssd-bytes", "0",
                             "--max-chunk-bytes", "32768", "--log-level", "warn"],
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if "listening on" not in line:
        proc.kill()
        sys.exit(f"kvcached did not start: {line!r}")
    return proc, line.split("listening on ")[1].split(" ")[0]


def timed(calls, fn):
    lat = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        lat.append(time.perf_counter() - t0)
    lat.sort()
    return {"p50_ms": 1e3 * lat[len(lat) // 2], "p99_ms": 1e3 * lat[min(len(lat) - 1, int(0.99 * len(lat)))]}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=1_000_000)
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--kvcached", default=os.path.join(ROOT, "build", "bin", "kvcached"))
    p.add_argument("--config", default=os.path.join(ROOT, "configs", "mini.json"))
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    if not hashing.native_hashing():
        sys.exit("libkvcache_hash.so did not load (build the C++ tree first: scripts/build.sh)")
    seed = int.from_bytes(os.urandom(8), "little")
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as folder:
        proc, address = start_daemon(a.kvcached, folder)
        try:
            with kvcache.Client(address) as c:
                ns = c.register_namespace(open(a.config).read(), "kvbench-lookup", chunk_tokens=256)
                tokens = rng.integers(0, ns.vocab_size or 256, a.tokens, dtype=np.uint32)
                keys = c.chunk_keys(ns, tokens)
                chunks = len(keys)
                for at in range(0, chunks, 256):  # in slices: bounded streams
                    part = tokens[at * 256:(at + 256) * 256]
                    payload = rng.integers(1, 256, (len(part) // 256, ns.chunk_bytes), dtype=np.uint8)
                    parent = keys[at - 1] if at > 0 else None
                    c.store(ns, part, payload, parent=parent, durable=False)
                assert c.lookup(ns, tokens).matched_chunks == chunks

                def by_tokens():
                    assert c.lookup(ns, tokens).matched_chunks == chunks

                def by_keys():
                    assert c.lookup_keys(ns, keys).matched_chunks == chunks

                native = timed(a.calls, by_tokens)
                with hashing.python_hashing():
                    python = timed(a.calls, by_tokens)
                kept = timed(a.calls, by_keys)
        finally:
            proc.terminate()
            proc.wait()
    out = {"seed": seed, "tokens": a.tokens, "chunks": chunks, "calls": a.calls,
           "tokens_native_hashing": native, "tokens_python_hashing": python, "kept_keys": kept}
    if a.json:
        print(json.dumps(out))
        return
    print(f"Python client, Lookup of a cached {a.tokens}-token prefix ({chunks} chunks), "
          f"{a.calls} calls each (seed {seed}):")
    for name, r in [("tokens, native hashing", native), ("tokens, Python hashing (peer)", python),
                    ("kept keys", kept)]:
        print(f"  {name:30s} p50 {r['p50_ms']:6.2f} ms  p99 {r['p99_ms']:6.2f} ms  "
              f"(p99 {r['p99_ms'] / python['p99_ms']:.2f}x the peer's)")


if __name__ == "__main__":
    main()
