#!/usr/bin/python3
"""Writes the routing vectors (tests/cluster/lookup_plan_vectors.json): for a few
memberships, keys and widths, which keys a Lookup asks each node about (docs/cluster.md,
"Lookup by ranking"); and for keys, holders a lookup saw and reader salts, the order a fetch
asks the nodes in ("fetch_orders").

An implementation of its own, from the rules as docs/cluster.md states them — it imports
neither client (only xxhash, for the rule's hash) — so that the C++ client's planner
(cluster/placement.h) and the Python client's (kvcache.cluster) are each held to vectors
neither of them wrote:

  - kvcache-rendezvous-v1: a node's weight for a key is XXH3-64 (seed 0) of the key's 16
    bytes followed by the node id's UTF-8 bytes; the ranking is by weight, highest first,
    ties to the smaller id (bytewise).
  - Lookup plan: key i is asked of its first `ask` ranked nodes; `ask` >= members: every
    node is asked every key. Per node, its keys in key order.
  - Fetch order: the holders a lookup saw that are still members (in the lookup's order),
    then every other member by rank; of the first `copies` (the holders seen, or the first
    `replicas` ranked when none was seen) the reader starts at copy
    XXH3-64(key ‖ salt) mod copies and goes round them.

  /usr/bin/python3 scripts/lookup_plan_vectors.py > tests/cluster/lookup_plan_vectors.json

(python/tests/test_cluster.py checks that the committed file is what this writes.)
"""
import hashlib
import json
import sys
from typing import Dict, List

import xxhash

RULE = "kvcache-rendezvous-v1"


def weight(key: bytes, node: str) -> int:
    return xxhash.xxh3_64_intdigest(key + node.encode("utf-8"))


def ranking(key: bytes, members: List[str]) -> List[str]:
    by_weight: Dict[int, List[str]] = {}
    for m in members:
        by_weight.setdefault(weight(key, m), []).append(m)
    out: List[str] = []
    for w in sorted(by_weight, reverse=True):
        out.extend(sorted(by_weight[w], key=lambda m: m.encode("utf-8")))
    return out


def lookup_plan(keys: List[bytes], members: List[str], ask: int) -> Dict[str, List[int]]:
    asked: Dict[str, List[int]] = {m: [] for m in members}
    for i, key in enumerate(keys):
        for m in (members if ask >= len(members) else ranking(key, members)[:ask]):
            asked[m].append(i)
    return asked


def fetch_sequence(key: bytes, members: List[str], seen: List[str], replicas: int,
                   salt: str) -> List[str]:
    seen_here = [h for h in seen if h in members]
    rest = [m for m in ranking(key, members) if m not in seen_here]
    copies = len(seen_here) if seen_here else min(replicas, len(members))
    sequence = seen_here + rest
    start = weight(key, salt) % copies if copies else 0
    first = sequence[:copies]
    return first[start:] + first[:start] + sequence[copies:]


def main() -> None:
    memberships = [
        ["n0", "n1", "n2"],
        ["node-a", "node-b", "node-c", "gpu-host-17.rack2", "n1"],
        [f"gpu-{i:03d}" for i in range(12)],
    ]
    # Keys anyone can recompute: SHA-256 of "key i", first 16 bytes.
    keys = [hashlib.sha256(f"key {i}".encode()).digest()[:16] for i in range(10)]
    cases = []
    for members in memberships:
        for ask in (1, 3, len(members)):
            cases.append({"nodes": members, "ask": ask, "plan": lookup_plan(keys, members, ask)})
    fetch_orders = []  # each names its membership by index (the lists are written once)
    for m, members in enumerate(memberships):
        for i, key in enumerate(keys[:4]):
            ranked = ranking(key, members)
            # No lookup yet; the second owner alone; both owners; a holder gone from the
            # membership and one ranked last.
            for seen in ([], [ranked[1]], ranked[:2], ["gone", ranked[-1]]):
                for salt in ("reader-a", "reader-b", "reader-c"):
                    fetch_orders.append({"membership": m, "key": i, "holders": seen,
                                         "replicas": 2, "salt": salt,
                                         "order": fetch_sequence(key, members, seen, 2, salt)})
    doc = json.dumps({"rule": RULE, "keys": [k.hex() for k in keys], "cases": cases,
                      "memberships": memberships, "fetch_orders": fetch_orders}, indent=1)
    # One fetch-order case per line: 144 of them would otherwise take thousands of lines.
    head, _, tail = doc.partition('"fetch_orders": [')
    sys.stdout.write(head + '"fetch_orders": [\n' +
                     ",\n".join(json.dumps(c) for c in fetch_orders) + "\n ]\n}")
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
