#!/usr/bin/python3
"""Writes the routing vectors (tests/cluster/lookup_plan_vectors.json): for a few
memberships, keys and widths, which keys a Lookup asks each node about (docs/cluster.md,
"Lookup by ranking"); and for keys, holders a lookup saw and reader salts, the order a fetch
asks the nodes in ("fetch_orders": fetch_order). Computed from the placement rule's ranking (rank_nodes, itself held to
tests/cluster/placement_vectors.json); the C++ and Python cluster clients' planners are both
held to these vectors.

  PYTHONPATH=python /usr/bin/python3 scripts/lookup_plan_vectors.py \\
      > tests/cluster/lookup_plan_vectors.json
"""
import hashlib
import json
import sys

from kvcache.cluster import PLACEMENT_RULE, fetch_order, plan_lookup, rank_nodes


def main():
    memberships = [
        ["n0", "n1", "n2"],
        ["node-a", "node-b", "node-c", "gpu-host-17.rack2", "n1"],
        [f"gpu-{i:03d}" for i in range(12)],
    ]
    # Keys anyone can recompute: SHA-256 of "key i", first 16 bytes.
    keys = [hashlib.sha256(f"key {i}".encode()).digest()[:16] for i in range(10)]
    cases = []
    for nodes in memberships:
        for ask in (1, 3, len(nodes)):
            plan = plan_lookup(keys, nodes, ask)
            cases.append({"nodes": nodes, "ask": ask,
                          "plan": {n: idx for n, idx in zip(nodes, plan)}})
    fetch_orders = []  # each names its membership by index (the lists are written once)
    for m, nodes in enumerate(memberships):
        for i, key in enumerate(keys[:4]):
            ranked = rank_nodes(key, nodes)
            # No lookup yet; the second owner alone; both owners; a holder gone from the
            # membership and one ranked last.
            for holders in ([], [ranked[1]], ranked[:2], ["gone", ranked[-1]]):
                for salt in ("reader-a", "reader-b", "reader-c"):
                    fetch_orders.append({"membership": m, "key": i, "holders": holders,
                                         "replicas": 2, "salt": salt,
                                         "order": fetch_order(key, nodes, holders, 2, salt)})
    doc = json.dumps({"rule": PLACEMENT_RULE, "keys": [k.hex() for k in keys], "cases": cases,
                      "memberships": memberships, "fetch_orders": fetch_orders}, indent=1)
    # One fetch-order case per line: 144 of them would otherwise take thousands of lines.
    head, _, tail = doc.partition('"fetch_orders": [')
    sys.stdout.write(head + '"fetch_orders": [\n' +
                     ",\n".join(json.dumps(c) for c in fetch_orders) + "\n ]\n}")
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
