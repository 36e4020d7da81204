"""One Python client of `kvbench service` (systems python-grpc, python-shm, and
python-grpcio: the client without its native fetch library): fetches prefixes with the
kvcache package, as the C++ clients of the same run do. With --api sglang
or vllm it fetches through an engine adapter instead (systems sglang-grpc, sglang-shm,
vllm-grpc): SGLang's batch_get_v1 into a page_first host pool (each page as K and V halves),
or a vLLM tier's submit_load into the primary tier's blocks, polled with get_finished. The
adapters' pages are their own (a caller-keyed namespace, one page per data-set key, stored
once at start), of the same size as the data set's chunks.

    python3 python_fetch.py --target ADDR [--shm-socket PATH] --config F --keys-file F
                            --per-call P --client C [--api client|sglang|vllm]

Prints "ready" once connected and warmed up; then, per line "run SECONDS" on stdin, runs
fetches for that long and prints one JSON line {"calls", "seconds", "lat_us"}; "quit" ends.
Call i fetches keys[first .. first + P) with first = (i * 31 + C) % (len(keys) - P + 1),
into one preallocated buffer, exactly like the C++ loop.
"""
import argparse
import json
import sys
import time
from types import SimpleNamespace

import kvcache


class HostPool:
    """A page_first host pool: `pages` pages of two halves (K and V) in one uint8 tensor,
    whose buffer metadata is address arithmetic, as SGLang's own pools compute it."""

    def __init__(self, pages, page_bytes):
        import torch
        self.page_size = 1
        self.half = page_bytes // 2
        self.pages = pages
        self.kv = torch.randint(0, 256, (2, pages, self.half), dtype=torch.uint8)
        self.base = self.kv.data_ptr()

    def get_page_buffer_meta(self, indices):
        ptrs = []
        v = self.pages * self.half
        for i in indices.tolist():
            k = self.base + i * self.half
            ptrs += [k, k + v]
        return ptrs, [self.half] * len(ptrs)


def sglang_fetcher(a, keys, page_bytes):
    """fetch(first) -> pages loaded, through KvcacheHiCacheStorage.batch_get_v1."""
    import torch
    from kvcache.integrations.sglang import KvcacheHiCacheStorage
    cfg = SimpleNamespace(model_name="kvbench", is_mla_model=True, extra_config={
        "target": a.target, "shm_socket": a.shm_socket, "durable": False, "timeout_s": 30})
    storage = KvcacheHiCacheStorage(cfg, {})
    pool = HostPool(a.per_call, page_bytes)
    storage.register_mem_pool_host(pool)
    slots = torch.arange(a.per_call)
    names = [k.hex() for k in keys]
    for at in range(0, len(names), a.per_call):  # every data-set key gets a page
        batch = names[at:at + a.per_call]
        if not all(storage.batch_set_v1(batch, slots[:len(batch)])):
            sys.exit("python_fetch: the sglang adapter could not store its pages")
    return lambda first: sum(storage.batch_get_v1(names[first:first + a.per_call], slots))


def vllm_fetcher(a, keys, page_bytes):
    """fetch(first) -> blocks loaded, through KvcacheSecondaryTier.submit_load."""
    import numpy as np
    import torch
    from kvcache.integrations.vllm import KvcacheSecondaryTier
    cpu = torch.zeros((a.per_call, page_bytes), dtype=torch.uint8)
    tier = KvcacheSecondaryTier(SimpleNamespace(block_size=256), memoryview(cpu.numpy()),
                                "kvcache", target=a.target, shm_socket=a.shm_socket,
                                model_id="kvbench", durable=False, timeout_s=30, io_threads=1)
    blocks = np.arange(a.per_call)
    job = [0]

    def run(kind, first, n):
        job[0] += 1
        meta = SimpleNamespace(job_id=job[0], keys=keys[first:first + n], block_ids=blocks[:n],
                               is_promotion=kind == "load", req_context=None)
        (tier.submit_load if kind == "load" else tier.submit_store)(meta)
        while True:  # vLLM polls once per scheduler step; here every 0.5 ms
            for r in tier.get_finished():
                return n if r.success else 0
            time.sleep(0.0005)
    for at in range(0, len(keys), a.per_call):
        n = min(a.per_call, len(keys) - at)
        if run("store", at, n) != n:
            sys.exit("python_fetch: the vllm tier could not store its blocks")
    return lambda first: run("load", first, a.per_call)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--target", required=True)
    p.add_argument("--shm-socket", default="")
    p.add_argument("--config", required=True)
    p.add_argument("--keys-file", required=True)
    p.add_argument("--per-call", type=int, required=True)
    p.add_argument("--client", type=int, required=True)
    p.add_argument("--api", choices=["client", "sglang", "vllm"], default="client")
    p.add_argument("--no-native-fetch", action="store_true",
                   help="fetch through grpcio alone (system python-grpcio)")
    a = p.parse_args()
    client = kvcache.Client(a.target, shm_socket=a.shm_socket,
                            native_fetch=not a.no_native_fetch)
    if not a.no_native_fetch and not client.native_fetch and a.client == 0:
        print("python_fetch: no native fetch library beside the package (the C++ build puts "
              "python/kvcache/libkvcache_fetch.so there): this system fetches through grpcio",
              file=sys.stderr)
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
    if a.api == "client":
        def fetch(first):
            return client.fetch(ns, keys[first:first + a.per_call], out).chunks
    else:
        fetch = (sglang_fetcher if a.api == "sglang" else vllm_fetcher)(a, keys, ns.chunk_bytes)
        fetch(0)  # warm
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
            got = fetch(first)
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
