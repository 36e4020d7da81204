#!/usr/bin/env python3
"""Prints a config's Engram hash multipliers (the reference rule, with numpy's PCG64):

    rng = numpy.random.default_rng(10007 * layer_id)
    m = rng.integers(0, ((2**63 - 1) // compressed_vocab) // 2, size=max_ngram) * 2 + 1

Usage: scripts/engram_multipliers.py CONFIG.json  ->  "engram_multipliers": [[...], ...]
For the published config this prints the values the model notes list (layer 1 begins
76632096046245, layer 14 begins 67716810739261).
"""
import json
import sys

import numpy as np


def main() -> None:
    cfg = json.load(open(sys.argv[1]))
    cfg = cfg.get("text_config", cfg)
    vc = cfg["engram_compressed_vocab_size"]
    n = cfg["engram_max_ngram_size"]
    rows = []
    for layer in cfg["engram_layer_ids"]:
        rng = np.random.default_rng(10007 * layer)
        rows.append([int(v) for v in rng.integers(0, ((2**63 - 1) // vc) // 2, size=n) * 2 + 1])
    print('"engram_multipliers": ' + json.dumps(rows))


if __name__ == "__main__":
    main()
