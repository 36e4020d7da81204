"""Bits per byte of trained weights on text, by language, with 95 % intervals: the outside
check (code the corpus never read, `outside-v1.json`) or any manifest's split.

    cd train && /usr/bin/python3 -m kvtrain.score --weights weights/small-v2-plain.safetensors
    /usr/bin/python3 -m kvtrain.score --weights W --manifest corpus-v2.json --split held_out

Per language, up to --files files (at least --min-bytes long; which ones: a seeded shuffle
of the manifest's order) each give one window of --seq bytes at a seeded offset; the model
reads it cold and every byte after the first is scored. A language's figure is its bytes'
total loss over their count; its interval resamples the files (2,000 times), since a file's
bytes share their text and err together. Exits 1 when --target is given and the overall
figure is above it."""
from __future__ import annotations

import argparse
import json
import lzma
import math
import os
import sys
import zlib
from typing import Dict, List, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from . import corpus, safetensors_io, tokenizer
from .config import load_config
from .model import V41

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.dirname(HERE)


def windows(manifest: str, split: str, files: int, seq: int, min_bytes: int,
            seed: int) -> Dict[str, List[Tuple[str, bytes]]]:
    """language → [(path, window bytes)]: the files each language's figure reads."""
    with open(manifest) as f:
        entries = [e for e in json.load(f)["files"]
                   if e["split"] == split and e["bytes"] >= min_bytes]
    rng = np.random.default_rng(seed)
    by_language: Dict[str, List[dict]] = {}
    for e in entries:
        by_language.setdefault(e.get("language", "c"), []).append(e)
    out: Dict[str, List[Tuple[str, bytes]]] = {}
    for language in sorted(by_language):
        chosen = [by_language[language][i] for i in rng.permutation(len(by_language[language]))]
        for e in chosen[:files]:
            text = corpus.read_checked(e, manifest)
            start = int(rng.integers(0, max(1, len(text) - seq)))
            out.setdefault(language, []).append((e["path"], text[start:start + seq]))
    return out


def file_losses(model: V41, texts: List[bytes]) -> np.ndarray:
    """[files, 2]: each text's summed loss in bits and its scored bytes."""
    rows = []
    with torch.no_grad():
        for t in texts:
            x = torch.tensor(tokenizer.encode(t), dtype=torch.long)[None]
            logits = model(x[:, :-1])
            nats = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1),
                                   reduction="sum")
            rows.append((float(nats) / math.log(2), x.shape[1] - 1))
    return np.array(rows, dtype=np.float64)


def compressor_bits(texts: List[bytes]) -> Dict[str, float]:
    """The same windows through general-purpose compressors, each window alone as the model
    reads it: bits per byte of their output (the peer a byte model has to beat)."""
    n = sum(len(t) for t in texts)
    return {"gzip-9": 8.0 * sum(len(zlib.compress(t, 9)) for t in texts) / n,
            "xz-9e": 8.0 * sum(len(lzma.compress(t, preset=9 | lzma.PRESET_EXTREME))
                               for t in texts) / n}


def ratio_interval(rows: np.ndarray, resamples: int, seed: int) -> Tuple[float, float]:
    """95 % bootstrap interval of Σ bits / Σ bytes, resampling rows."""
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, len(rows), size=(resamples, len(rows)))
    ratios = rows[pick, 0].sum(1) / rows[pick, 1].sum(1)
    return float(np.quantile(ratios, 0.025)), float(np.quantile(ratios, 0.975))


def summarize(rows: np.ndarray, resamples: int, seed: int) -> dict:
    lo, hi = ratio_interval(rows, resamples, seed)
    return {"bits_per_byte": float(rows[:, 0].sum() / rows[:, 1].sum()), "ci95": [lo, hi],
            "files": int(len(rows)), "bytes": int(rows[:, 1].sum())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--weights", required=True, help="safetensors from kvtrain.train")
    ap.add_argument("--config", default=os.path.join(TRAIN, "..", "configs", "small.json"))
    ap.add_argument("--manifest", default=os.path.join(TRAIN, "outside-v1.json"))
    ap.add_argument("--split", default="outside")
    ap.add_argument("--files", type=int, default=32, help="files per language")
    ap.add_argument("--seq", type=int, default=1024, help="bytes per file's window")
    ap.add_argument("--min-bytes", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--bootstrap", type=int, default=2000)
    ap.add_argument("--target", type=float, default=0.0,
                    help="exit 1 when the overall bits/byte is above this (0: no target)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.seq < 2 or args.files < 1:
        ap.error("--seq must be at least 2 and --files at least 1")
    torch.set_num_threads(args.threads)
    model = V41(load_config(args.config))
    model.load_tensors(safetensors_io.read(args.weights))
    model.eval()
    chosen = windows(args.manifest, args.split, args.files, args.seq, args.min_bytes, args.seed)
    if not chosen:
        raise SystemExit(f"{args.manifest} has no {args.split!r} files of at least "
                         f"{args.min_bytes} bytes")
    per: Dict[str, np.ndarray] = {lang: file_losses(model, [t for _, t in w])
                                  for lang, w in chosen.items()}
    report = {"weights": os.path.basename(args.weights), "manifest": os.path.basename(args.manifest),
              "split": args.split, "seq": args.seq, "seed": args.seed,
              "languages": {lang: summarize(r, args.bootstrap, args.seed) for lang, r in per.items()},
              "overall": summarize(np.concatenate(list(per.values())), args.bootstrap, args.seed),
              "compressors": compressor_bits([t for w in chosen.values() for _, t in w])}
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(f"{report['weights']} on {report['manifest']} ({args.split}), "
              f"one {args.seq}-byte window per file, seed {args.seed}:")
        for lang, s in list(report["languages"].items()) + [("overall", report["overall"])]:
            print(f"  {lang:8s} {s['bits_per_byte']:.3f} bits/byte "
                  f"[{s['ci95'][0]:.3f}, {s['ci95'][1]:.3f}]  {s['files']} files, {s['bytes']} bytes")
        print("  the same windows compressed one by one: " + ", ".join(
            f"{k} {v:.3f} bits/byte" for k, v in report["compressors"].items()))
    if args.target and report["overall"]["bits_per_byte"] > args.target:
        print(f"above the target: {report['overall']['bits_per_byte']:.3f} > {args.target} "
              "bits/byte", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
