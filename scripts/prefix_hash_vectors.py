#!/usr/bin/env python3
"""Independent Python implementation of kvcache's public prefix hashing
(docs/prefix-hashing.md) — derived keys and caller keys — used to write tests/client/prefix_hash_vectors.json, which the
C++ tests check. Needs the `xxhash` module (Debian: python3-xxhash).

  python3 scripts/prefix_hash_vectors.py > tests/client/prefix_hash_vectors.json
"""
import json
import random
import struct

import xxhash


def h128(data: bytes) -> bytes:
    return xxhash.xxh3_128_digest(data)  # canonical (big-endian) digest, seed 0


def s(text: str) -> bytes:
    b = text.encode("utf-8")
    return struct.pack("<I", len(b)) + b


def root(tenant: str, fingerprint: bytes, version: int, chunk_tokens: int) -> bytes:
    return h128(b"kvcache-ns-v1" + s(tenant) + fingerprint + struct.pack("<II", version, chunk_tokens))


def fingerprint(model_id: str, sections) -> bytes:
    out = b"kvcache-model-v1" + s(model_id) + struct.pack("<I", len(sections))
    for layer, kind, positions, nbytes in sections:
        out += struct.pack("<IIQQ", layer, kind, positions, nbytes)
    return h128(out)


def chunk_keys(root_key: bytes, tokens, chunk_tokens: int):
    keys, prev = [], root_key
    for at in range(0, len(tokens) - chunk_tokens + 1, chunk_tokens):
        prev = h128(prev + struct.pack(f"<{chunk_tokens}I", *tokens[at:at + chunk_tokens]))
        keys.append(prev.hex())
    return keys


def caller_root(tenant: str, model_id: str, page_bytes: int, page_tokens: int) -> bytes:
    return h128(b"kvcache-caller-ns-v1" + s(tenant) + s(model_id) +
                struct.pack("<QI", page_bytes, page_tokens))


def caller_chunk_key(root_key: bytes, caller_key: bytes) -> bytes:
    return h128(b"kvcache-caller-key-v1" + root_key + struct.pack("<I", len(caller_key)) + caller_key)


def caller_vectors(rng):
    out = []
    for tenant, model_id, page_bytes, page_tokens in [("default", "sglang/DeepSeek-V4.1-Flash", 57344, 64),
                                                     ("acme", "vllm/llama", 2097152, 16),
                                                     ("ünïcode-tenant", "m", 1, 0)]:
        r = caller_root(tenant, model_id, page_bytes, page_tokens)
        keys = [bytes(rng.randrange(256) for _ in range(32)).hex().encode(),  # a SHA-256 hex digest
                bytes(rng.randrange(256) for _ in range(1)),
                bytes(rng.randrange(256) for _ in range(64)),
                "ключ".encode()]
        out.append({"tenant": tenant, "model_id": model_id, "page_bytes": page_bytes,
                    "page_tokens": page_tokens, "root_key": r.hex(),
                    "keys": [{"caller_key": k.hex(), "chunk_key": caller_chunk_key(r, k).hex()}
                             for k in keys]})
    return out


def main():
    rng = random.Random(20261130)
    # The reference config's chunk layout at C = 256 (kvfmt layout prints it).
    sections = []
    for layer, ratio in [(2, 2), (8, 2), (14, 2), (20, 1)]:
        p = 256 // ratio
        for kind, nbytes in enumerate([p * 256, p * 32, p * 64, p * 4]):
            sections.append((layer, kind, p, nbytes))
    fp = fingerprint("deepseek-ai/DeepSeek-V4.1-Flash", sections)
    vectors = []
    for tenant, chunk_tokens, n_tokens in [("default", 256, 1000), ("acme", 256, 512), ("acme", 64, 200),
                                           ("ünïcode-tenant", 8, 37), ("default", 256, 100)]:
        r = root(tenant, fp, 1, chunk_tokens)
        tokens = [rng.randrange(0, 129280) for _ in range(n_tokens)]
        vectors.append({"tenant": tenant, "chunk_tokens": chunk_tokens, "kv_layout_version": 1,
                        "root_key": r.hex(), "tokens": tokens, "chunk_keys": chunk_keys(r, tokens, chunk_tokens)})
    print(json.dumps({"model_id": "deepseek-ai/DeepSeek-V4.1-Flash",
                      "config": "configs/deepseek-v4.1-flash.config.json",
                      "model_fingerprint": fp.hex(), "vectors": vectors,
                      "caller_vectors": caller_vectors(rng)}, indent=1))


if __name__ == "__main__":
    main()
