"""One Python client of `kvbench service` (systems python-grpc and python-shm): fetches
prefixes with the kvcache package, as the C++ clients of the same run do.

    python3 python_fetch.py --target ADDR [--shm-socket PATH] --config F --keys-file F
                            --per-call P --client C

Prints "ready" once connected and warmed up; then, per line "run SECONDS" on stdin, runs
fetches for that long and prints one JSON line {"calls", "seconds", "lat_us"}; "quit" ends.
Call i fetches keys[first .. first + P) with first = (i * 31 + C) % (len(keys) - P + 1),
into one preallocated buffer, exactly like the C++ loop.
"""
import argparse
import json
import sys
import time

import kvcache


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--target", required=True)
    p.add_argument("--shm-socket", default="")
    p.add_argument("--config", required=True)
    p.add_argument("--keys-file", required=True)
    p.add_argument("--per-call", type=int, required=True)
    p.add_argument("--client", type=int, required=True)
    a = p.parse_args()
    client = kvcache.Client(a.target, shm_socket=a.shm_socket)
    if a.shm_socket and not client.shared_memory:
        sys.exit(f"python_fetch: no shared memory: {client.shm_error}")
    with open(a.config) as f:
        ns = client.register_namespace(f.read(), "kvbench")
    with open(a.keys_file) as f:
        keys = [bytes.fromhex(line.strip()) for line in f if line.strip()]
    span = len(keys) - a.per_call + 1
    out = bytearray(a.per_call * ns.chunk_bytes)
    if client.fetch(ns, keys[:a.per_call], out).chunks != a.per_call:
        sys.exit("python_fetch: the data set is not cached")
    print("ready", flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        seconds = float(words[1])
        lat_us = []
        i = 0
        start = time.perf_counter()
        end = start + seconds
        now = start
        while now < end:
            first = (i * 31 + a.client) % span
            got = client.fetch(ns, keys[first:first + a.per_call], out).chunks
            if got != a.per_call:
                sys.exit(f"python_fetch: fetch missed ({got} of {a.per_call})")
            t = time.perf_counter()
            lat_us.append((t - now) * 1e6)
            now = t
            i += 1
        print(json.dumps({"calls": i, "seconds": now - start, "lat_us": lat_us}), flush=True)
    client.close()


if __name__ == "__main__":
    main()
