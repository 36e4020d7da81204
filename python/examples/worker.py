"""The skeleton of an inference worker on kvcache: what a vLLM or SGLang connector does,
with no dependency on either.

Per request: ask how much of the prompt is cached (lookup), fetch that prefix straight
into the worker's page pool, run the model on the rest (here a stand-in that writes
deterministic bytes where the engine's KV would go), and store the new whole chunks.

The page pool is one numpy array of pages; a page is one chunk's payload, laid out as
docs/kv-format.md says (for each Full layer: main codes, main scales, index codes, index
scales) — the engine's own paged-KV layout, so a fetched chunk needs no repacking.

    PYTHONPATH=python python3 python/examples/worker.py --server 127.0.0.1:50051 \\
        --config configs/mini.json --model-id mini --chunk-tokens 64 --turns 3

An agent session: every turn the prompt grows by --tokens-per-turn; from the second turn
on, the previous turns' chunks come from the cache.
"""
import argparse
import hashlib
import sys
import time

import numpy as np

import kvcache


def stand_in_kv(key, chunk_bytes):
    """What the engine would write into a page for the chunk named `key` (deterministic,
    so a later fetch can be checked byte for byte)."""
    seed = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")
    return np.random.default_rng(seed).integers(0, 256, chunk_bytes, dtype=np.uint8)


class PagePool:
    """A worker's paged KV memory: free pages handed out, contiguous when possible."""

    def __init__(self, pages, page_bytes):
        self.data = np.empty((pages, page_bytes), dtype=np.uint8)
        self.next = 0

    def take(self, n):
        if self.next + n > len(self.data):
            self.next = 0  # a real worker evicts; the skeleton recycles
        first = self.next
        self.next += n
        return first


def serve_turn(client, ns, pool, prompt):
    t0 = time.perf_counter()
    match = client.lookup(ns, prompt)
    whole = len(prompt) // ns.chunk_tokens
    first = pool.take(whole)
    pages = pool.data[first:first + whole]  # this request's page table: first..first+whole
    got = client.fetch(ns, match.matched_keys, out=pages[:match.matched_chunks])
    reused = got.chunks
    # The engine would now prefill tokens [reused × C, len(prompt)) reading pages[:reused].
    keys = client.chunk_keys(ns, prompt)
    for i in range(reused, whole):
        pages[i] = stand_in_kv(keys[i], ns.chunk_bytes)
    stored = client.store(ns, prompt[reused * ns.chunk_tokens:whole * ns.chunk_tokens],
                          pages[reused:whole], parent=keys[reused - 1] if reused else None)
    bad = sum(not np.array_equal(pages[i], stand_in_kv(keys[i], ns.chunk_bytes))
              for i in range(reused))
    return {"prompt_tokens": len(prompt), "reused_tokens": reused * ns.chunk_tokens,
            "from_shm": got.shm_chunks, "stored_chunks": stored.stored,
            "wrong_chunks": bad, "ms": (time.perf_counter() - t0) * 1e3}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--server", default="127.0.0.1:50051")
    p.add_argument("--token", default=None)
    p.add_argument("--shm-socket", default=None, help="the daemon's socket, when co-located")
    p.add_argument("--config", required=True)
    p.add_argument("--model-id", required=True)
    p.add_argument("--chunk-tokens", type=int, default=0)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--tokens-per-turn", type=int, default=700)
    p.add_argument("--seed", type=int, default=None)
    a = p.parse_args()
    seed = a.seed if a.seed is not None else int.from_bytes(np.random.bytes(4), "little")
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    with kvcache.Client(a.server, token=a.token, shm_socket=a.shm_socket) as client:
        with open(a.config) as f:
            ns = client.register_namespace(f.read(), a.model_id, a.chunk_tokens)
        print(f"namespace {ns.id}: {ns.chunk_tokens} tokens, {ns.chunk_bytes} bytes per chunk; "
              f"shared memory: {'yes' if client.shared_memory else 'no ' + client.shm_error}")
        pool = PagePool(pages=a.turns * a.tokens_per_turn // ns.chunk_tokens + 8,
                        page_bytes=ns.chunk_bytes)
        prompt = np.zeros(0, dtype=np.int64)
        wrong = 0
        for turn in range(1, a.turns + 1):
            new = rng.integers(0, ns.vocab_size or 2**16, a.tokens_per_turn)
            prompt = np.concatenate([prompt, new])
            r = serve_turn(client, ns, pool, prompt)
            wrong += r["wrong_chunks"]
            print(f"turn {turn}: {r['prompt_tokens']} tokens, reused {r['reused_tokens']} "
                  f"({r['from_shm']} chunks from shared memory), stored {r['stored_chunks']} "
                  f"chunks, {r['ms']:.1f} ms")
        if wrong:
            print(f"{wrong} fetched chunks differ from what was stored", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
