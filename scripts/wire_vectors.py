#!/usr/bin/python3
"""Writes tests/wire/wire_vectors.json: the bytes wire/ (C++) and python/kvcache/_wire.py
frame by hand, as protobuf's own encoder writes them — so both implementations are held to
the .proto, not to each other. Needs the generated Python stubs (a build):

    PYTHONPATH=python scripts/wire_vectors.py > tests/wire/wire_vectors.json
"""
import json
import random
import sys

from kvcache.v1 import kvcache_pb2 as pb


def main() -> int:
    rng = random.Random(20261203)  # fixed: the file is checked in and must not churn
    keys = [bytes(rng.randrange(256) for _ in range(16)) for _ in range(3)]
    out = {"keys": [k.hex() for k in keys], "packed": b"".join(keys).hex(), "fetch": [],
           "fetch_other_encodings": [], "store": []}
    for n in [1, 127, 128, 16383, 16384, 227840]:  # a chunk is never empty
        payload = bytes(rng.randrange(256) for _ in range(min(n, 64))) * (n // 64 + 1)
        payload = payload[:n]
        msg = pb.FetchResponse(chunk_key=keys[0], payload=payload).SerializeToString()
        assert msg.endswith(payload)
        out["fetch"].append({"key": keys[0].hex(), "payload_bytes": n,
                             "header": msg[:len(msg) - n].hex()})
    payload = bytes(range(40))
    # Fields in the other order (concatenated messages merge), and an unknown field too.
    swapped = (pb.FetchResponse(payload=payload).SerializeToString() +
               pb.FetchResponse(chunk_key=keys[1]).SerializeToString())
    unknown = pb.FetchResponse(chunk_key=keys[2], payload=payload).SerializeToString() + \
        bytes([(9 << 3) | 2, 3]) + b"abc"
    for m, k in [(swapped, keys[1]), (unknown, keys[2])]:
        out["fetch_other_encodings"].append({"message": m.hex(), "key": k.hex(),
                                             "payload": payload.hex()})
    for parent, tokens, n in [(b"", [5], 8), (keys[0], [1, 2, 300, 70000], 33)]:
        payload = bytes(rng.randrange(256) for _ in range(n))
        m = pb.StoreRequest(namespace_id=7, parent_key=parent, tokens=tokens,
                            durability=pb.DURABILITY_DURABLE, ttl_seconds=60,
                            payload=payload).SerializeToString()
        out["store"].append({"namespace_id": 7, "parent_key": parent.hex(), "tokens": tokens,
                             "durability": pb.DURABILITY_DURABLE, "ttl_seconds": 60,
                             "payload": payload.hex(), "message": m.hex()})
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
