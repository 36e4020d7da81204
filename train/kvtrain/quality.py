"""What a resume from the cache costs in answers, measured with the C++ engine (kvgen)
on held-out documents (python3 -m kvtrain.quality --help).

    /usr/bin/python3 -m kvtrain.quality --config ../configs/small.json \\
        --weights plain=weights/small-plain.safetensors \\
        --weights replay=weights/small-replay.safetensors --json out.json

Per document and resume point P (a multiple of --chunk-tokens, well past the window), the
prompt is the document's first P + NEW tokens; each mode runs it and decodes --steps
tokens greedily, dumping every step's logits:
  full     cold prefill at full depth (the reference)
  ced      cold CED prefill (the decoder over the last window only)
  bounded  resume from the pages of the first P tokens, the window rebuilt by the model's
           bounded replay (encoder replay of W tokens, CED decoder)
  exact    resume with the exact replay (must equal `ced` bit for bit)
Against a reference: KL(ref ‖ mode) of the next-token distribution after the prompt (mean,
p99), the same over every decode step while both runs have produced the same tokens,
greedy agreement (the share of the --steps positions whose token matches), and the loss
difference of the document's true next token after the prompt, in bits.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from typing import Dict, List

import numpy as np

from . import corpus, tokenizer
from .config import load_config

HERE = os.path.dirname(os.path.abspath(__file__))


def kvgen(bin_dir: str, config: str, weights: str, prompt: List[int], steps: int, tmp: str,
          *extra: str, vocab: int = 0) -> dict:
    p = os.path.join(tmp, "prompt.txt")
    with open(p, "w") as f:
        f.write(" ".join(map(str, prompt)))
    dump = os.path.join(tmp, "logits.f32")
    r = subprocess.run([os.path.join(bin_dir, "kvgen"), "--config", config, "--weights", weights,
                        "--prompt", p, "--max-new-tokens", str(steps), "--greedy",
                        "--dump-logits", dump, "--json", *extra],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"kvgen {' '.join(extra)}: {r.stderr.strip()}")
    out = json.loads(r.stdout)
    out["logits"] = np.fromfile(dump, dtype="<f4").reshape(-1, vocab or load_config(config).vocab_size)
    return out


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def kl(ref: np.ndarray, other: np.ndarray) -> np.ndarray:
    lp, lq = log_softmax(ref), log_softmax(other)
    return (np.exp(lp) * (lp - lq)).sum(-1)


def compare(ref: dict, run: dict, true_next: int) -> dict:
    a, b = ref["generated"], run["generated"]
    same = 0  # decode steps whose contexts are still identical (the prompt, then equal tokens)
    while same < len(a) and same < len(b) and (same == 0 or a[same - 1] == b[same - 1]):
        same += 1
    kls = kl(ref["logits"][:same], run["logits"][:same])
    lp_ref, lp_run = log_softmax(ref["logits"][0]), log_softmax(run["logits"][0])
    return {"kl_first": float(kls[0]), "kl_steps": [float(x) for x in kls],
            "agreement": float(np.mean([x == y for x, y in zip(a, b)])),
            "identical": bool(np.array_equal(ref["logits"].view(np.uint32),
                                             run["logits"].view(np.uint32))),
            "loss_diff_bits": float((lp_ref[true_next] - lp_run[true_next]) / np.log(2))}


def summarize(rows: List[dict]) -> dict:
    first = np.array([r["kl_first"] for r in rows])
    steps = np.array([k for r in rows for k in r["kl_steps"]])
    return {"cases": len(rows), "kl_mean": float(first.mean()), "kl_p99": float(np.percentile(first, 99)),
            "kl_steps_mean": float(steps.mean()), "kl_steps_p99": float(np.percentile(steps, 99)),
            "agreement": float(np.mean([r["agreement"] for r in rows])),
            "loss_diff_bits": float(np.mean([r["loss_diff_bits"] for r in rows])),
            "bit_identical": all(r["identical"] for r in rows)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--weights", action="append", required=True, help="NAME=FILE (repeatable)")
    ap.add_argument("--manifest", default=os.path.join(HERE, "..", "corpus.json"))
    ap.add_argument("--held-out", nargs="*", default=None, help="text files (default: the "
                    "corpus's held-out split)")
    ap.add_argument("--documents", type=int, default=8)
    ap.add_argument("--points", type=int, default=2, help="resume points per document")
    ap.add_argument("--chunk-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=32, help="prompt tokens after P")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--max-prompt-tokens", type=int, default=3072,
                    help="resume points at most this far into a document (a cold prefill at "
                         "full depth is quadratic in the prompt: every indexer scores every "
                         "position)")
    ap.add_argument("--dspark-prompts", type=int, default=4)
    ap.add_argument("--bin-dir", default=os.path.join(HERE, "..", "..", "build", "bin"))
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    c = load_config(args.config)
    W = c.sliding_window
    if args.held_out:
        docs = {p: open(p, "rb").read() for p in args.held_out}
    else:
        docs = corpus.held_out_documents(args.manifest)
    min_len = 2 * W + 2 * args.chunk_tokens + args.new_tokens + args.steps + 1
    names = sorted(p for p, d in docs.items() if len(d) >= min_len)[:args.documents]
    result: Dict[str, dict] = {"config": os.path.basename(args.config), "window": W,
                               "date": time.strftime("%Y-%m-%d"), "documents": names,
                               "variants": {}}
    for spec in args.weights:
        name, path = spec.split("=", 1)
        rows: Dict[str, List[dict]] = {"ced_vs_full": [], "bounded_vs_full": [],
                                       "bounded_vs_ced": [], "exact_vs_ced": []}
        with tempfile.TemporaryDirectory() as tmp:
            for doc in names:
                toks = tokenizer.encode(docs[doc])
                last = (min(len(toks) - args.steps - 1, args.max_prompt_tokens) -
                        args.new_tokens) // args.chunk_tokens
                first = (2 * W + args.chunk_tokens - 1) // args.chunk_tokens
                points = np.linspace(first, max(first, last), args.points).astype(int)
                for k in sorted(set(points.tolist())):
                    P = int(k) * args.chunk_tokens
                    prompt = toks[:P + args.new_tokens]
                    nxt = toks[P + args.new_tokens]
                    run = lambda *e: kvgen(args.bin_dir, args.config, path, prompt, args.steps,
                                           tmp, "--chunk-tokens", str(args.chunk_tokens), *e,
                                           vocab=c.vocab_size)
                    full, ced = run("--no-ced"), run()
                    bounded = run("--resume-at", str(P), "--replay", "bounded")
                    exact = run("--resume-at", str(P), "--replay", "exact")
                    rows["ced_vs_full"].append(compare(full, ced, nxt))
                    rows["bounded_vs_full"].append(compare(full, bounded, nxt))
                    rows["bounded_vs_ced"].append(compare(ced, bounded, nxt))
                    rows["exact_vs_ced"].append(compare(ced, exact, nxt))
            # DSpark on the trained drafter: acceptance and decode speed beside plain decode.
            ds = {"drafted": 0, "accepted": 0, "plain_tok_s": [], "dspark_tok_s": []}
            for doc in names[:args.dspark_prompts]:
                prompt = tokenizer.encode(docs[doc])[:4 * W]
                plain = kvgen(args.bin_dir, args.config, path, prompt, args.steps, tmp)
                spec_run = kvgen(args.bin_dir, args.config, path, prompt, args.steps, tmp, "--dspark")
                ds["drafted"] += spec_run["dspark"]["drafted"]
                ds["accepted"] += spec_run["dspark"]["accepted"]
                ds["plain_tok_s"].append(plain["decode_tok_s"])
                ds["dspark_tok_s"].append(spec_run["decode_tok_s"])
            dspark = {"acceptance": ds["accepted"] / max(ds["drafted"], 1),
                      "plain_tok_s": float(np.median(ds["plain_tok_s"])),
                      "dspark_tok_s": float(np.median(ds["dspark_tok_s"]))}
            dspark["speedup"] = dspark["dspark_tok_s"] / max(dspark["plain_tok_s"], 1e-9)
        result["variants"][name] = {k: summarize(v) for k, v in rows.items()}
        result["variants"][name]["dspark"] = dspark
        print(name, json.dumps(result["variants"][name]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
