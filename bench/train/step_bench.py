#!/usr/bin/python3
"""Training tokens per second, one variant against another in the same run.

    /usr/bin/python3 bench/train/step_bench.py [--steps 8] [--rounds 2] [--config configs/small.json]

Each variant is `python3 -m kvtrain.train` itself (the real step: trunk, indexer loss,
drafter, AdamW, gate biases) for --steps steps on batch 2 × 1,024 tokens (--batch, --seq), started fresh in
its own process; the variants alternate round by round so that a noisy machine penalizes
them alike. Reported: each variant's tokens/s over the steps after the first (the first
pays for warming the allocator and caches), best of the rounds, and its ratio to the first
variant. The data are a few of corpus v2's training files (a step's cost does not depend
on which bytes it reads).

Variants: `glibc` (one process, one thread, glibc's default allocator settings and
model.py's PyTorch forms instead of the fused kernels), `torch-ops` (kvtrain/alloc.py's
settings, still the PyTorch forms), `kept` (alloc.py's settings and the fused kernels of
kvtrain/kernels.c: what training runs with), `kept-2threads`
(one process, two threads), `kept-2workers` (two data-parallel processes, one thread each),
`commit` (the trainer and configs of --commit, e.g. the code a speed-up is measured
against, one thread).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Tuple

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
TRAIN = os.path.join(ROOT, "train")

TORCH_FORMS = {"KVTRAIN_KERNELS": "0"}  # model.py's PyTorch forms, not kernels.c
# name: (the trainer's flags, its environment)
VARIANTS: Dict[str, Tuple[List[str], Dict[str, str]]] = {
    "glibc": (["--threads", "1", "--workers", "1", "--no-keep-freed-memory"], TORCH_FORMS),
    "torch-ops": (["--threads", "1", "--workers", "1"], TORCH_FORMS),
    "kept": (["--threads", "1", "--workers", "1"], {}),
    "kept-2threads": (["--threads", "2", "--workers", "1"], {}),
    "kept-2workers": (["--threads", "1", "--workers", "2"], {}),
}


def small_manifest(out_dir: str, files: int) -> str:
    """The first `files` training files and one held-out file of corpus v2."""
    with open(os.path.join(TRAIN, "corpus-v2.json")) as f:
        full = json.load(f)
    train = [e for e in full["files"] if e["split"] == "train" and e["bytes"] > 20000][:files]
    held = [e for e in full["files"] if e["split"] == "held_out" and e["bytes"] > 20000][:1]
    path = os.path.join(out_dir, "manifest.json")
    with open(path, "w") as f:
        json.dump(dict(full, files=train + held, corpus_sha256="bench"), f)
    return path


def checkout(commit: str, tmp: str) -> str:
    """The repository's train/ and configs/ at `commit`, extracted under tmp: its trainer."""
    root = os.path.join(tmp, f"at-{commit}")
    os.makedirs(root)
    archive = subprocess.run(["git", "-C", ROOT, "archive", commit, "train", "configs"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", root], input=archive, check=True)
    return root


def run_variant(name: str, args: argparse.Namespace, manifest: str, tmp: str) -> float:
    """Tokens/s of one run over its steps after the first (from the trainer's log)."""
    out = os.path.join(tmp, f"{name}-{time.monotonic_ns()}")
    train_dir, config = TRAIN, args.config
    flags, extra_env = VARIANTS.get(name, ([], {}))
    if name == "commit":  # the trainer of --commit, one thread, its own settings
        train_dir = os.path.join(args.commit_root, "train")
        config = os.path.join(args.commit_root, "configs", os.path.basename(args.config))
        flags = ["--threads", "1"]
    cmd = [sys.executable, "-m", "kvtrain.train", "--config", config, "--out", out,
           "--manifest", manifest, "--steps", str(args.steps), "--batch", str(args.batch),
           "--seq", str(args.seq),
           "--eval-every", "100000", "--checkpoint-every", "100000", "--seed", str(args.seed)]
    env = dict(os.environ, OMP_NUM_THREADS="2", **extra_env)
    r = subprocess.run(cmd + flags, cwd=train_dir, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"{name}: kvtrain.train exited {r.returncode}\n{r.stderr[-2000:]}")
    rows = [json.loads(l) for l in open(os.path.join(out, "log.jsonl"))]
    workers = int(flags[flags.index("--workers") + 1]) if "--workers" in flags else 1
    first, last = rows[0], rows[-1]
    tokens = (last["step"] - first["step"]) * args.batch * args.seq * workers
    return tokens / (last["elapsed_s"] - first["elapsed_s"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "small.json"))
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--files", type=int, default=40, help="training files in the small manifest")
    ap.add_argument("--manifest", default="",
                    help="train on this manifest instead of corpus v2's first --files files")
    ap.add_argument("--seed", type=int, default=int.from_bytes(os.urandom(2), "little"))
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help="comma-separated, the first is the baseline: " + ", ".join(VARIANTS)
                    + ", commit (--commit's trainer)")
    ap.add_argument("--commit", default="",
                    help="a commit of this repository whose trainer the `commit` variant runs")
    args = ap.parse_args()
    args.config = os.path.abspath(args.config)  # the trainer runs in train/
    names = args.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS and n != "commit"]
    if unknown:
        raise SystemExit(f"--variants: unknown {unknown} (known: {', '.join(VARIANTS)})")
    if "commit" in names and not args.commit:
        raise SystemExit("--variants commit needs --commit SHA")
    if args.steps < 3:
        raise SystemExit("--steps: at least 3 (the first is not timed)")
    print(f"seed {args.seed}, {args.steps} steps of batch {args.batch} x {args.seq}, {args.rounds} rounds, "
          f"config {os.path.basename(args.config)}", flush=True)
    best: Dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        manifest = os.path.abspath(args.manifest) if args.manifest else small_manifest(tmp, args.files)
        if args.commit:
            args.commit_root = checkout(args.commit, tmp)
        for r in range(args.rounds):
            for name in names:
                tps = run_variant(name, args, manifest, tmp)
                best[name] = max(best.get(name, 0.0), tps)
                print(f"round {r + 1}  {name:14s} {tps:7.0f} tok/s", flush=True)
    base = best[names[0]]
    print(f"{'variant':14s} {'tok/s':>7s}  vs {names[0]}")
    for name in names:
        print(f"{name:14s} {best[name]:7.0f}  {best[name] / base:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
