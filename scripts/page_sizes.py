#!/usr/bin/python3
"""What a serving engine's page costs in kvcached: page sizes of common models, computed from
their published configs, each stored on a real default kvcached and charged what Stats says.

    scripts/page_sizes.py [--bin build/bin] [--json]

Prints the table of docs/integrations.md ("Page sizes"): per model and engine, the page's
tokens and bytes, the bytes per token of KV, the bytes the cache charges the page (its slot:
header and rounding, from Stats' ssd_bytes before and after the store) and that per token.
Every page is fetched back and compared byte for byte. A page is one rank's (TP 1).

The model shapes are the config.json fields of each model's published config; V4.1's page
is what `kvfmt layout` computes from configs/deepseek-v4.1-flash.config.json (its global KV
in FP4, not a per-layer formula)."""
import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from typing import Any, Dict, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))

# Published configs (Hugging Face config.json field names).
GQA_8B = {"name": "Llama-3.1-8B (GQA)", "num_hidden_layers": 32, "num_key_value_heads": 8,
          "head_dim": 128}
MLA_V3 = {"name": "DeepSeek-V3 (MLA)", "num_hidden_layers": 61, "kv_lora_rank": 512,
          "qk_rope_head_dim": 64}


def gqa_token_bytes(c: Dict[str, Any], dtype_bytes: int) -> int:
    # K and V of every layer's KV heads
    return c["num_hidden_layers"] * 2 * c["num_key_value_heads"] * c["head_dim"] * dtype_bytes


def mla_token_bytes(c: Dict[str, Any], dtype_bytes: int) -> int:
    # one latent (kv_lora_rank) and its rotary key part per layer, shared by all heads
    return c["num_hidden_layers"] * (c["kv_lora_rank"] + c["qk_rope_head_dim"]) * dtype_bytes


def v41_page_bytes(bin_dir: str, tokens: int) -> int:
    out = subprocess.run([os.path.join(bin_dir, "kvfmt"), "layout", "--config",
                          os.path.join(ROOT, "configs", "deepseek-v4.1-flash.config.json"),
                          "--chunk-tokens", str(tokens)],
                         capture_output=True, text=True, check=True).stdout
    m = re.search(r"chunk of (\d+) tokens: (\d+) bytes", out)
    if not m or int(m.group(1)) != tokens:
        raise SystemExit(f"kvfmt layout printed {out[:200]!r}")
    return int(m.group(2))


def pages(bin_dir: str) -> List[Tuple[str, str, str, int, int]]:
    """(model, engine, KV dtype, page tokens, page bytes)."""
    rows = []
    for dtype, size in (("bf16", 2), ("fp8", 1)):
        rows.append((GQA_8B["name"], "SGLang (page 64)", dtype, 64, 64 * gqa_token_bytes(GQA_8B, size)))
        rows.append((GQA_8B["name"], "vLLM (block 16)", dtype, 16, 16 * gqa_token_bytes(GQA_8B, size)))
    for dtype, size in (("bf16", 2), ("fp8", 1)):
        rows.append((MLA_V3["name"], "SGLang (page 64)", dtype, 64, 64 * mla_token_bytes(MLA_V3, size)))
    rows.append((MLA_V3["name"], "vLLM (block 64)", "bf16", 64, 64 * mla_token_bytes(MLA_V3, 2)))
    for tokens in (64, 256):
        rows.append(("DeepSeek V4.1 Flash", f"kvcache engine ({tokens}-token chunk)",
                     "fp4 global KV", tokens, v41_page_bytes(bin_dir, tokens)))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from kvcache import api

    rows = pages(args.bin)
    seed = random.SystemRandom().randrange(1 << 32)
    rng = random.Random(seed)
    work = tempfile.mkdtemp(prefix="kvc-pages-")
    proc = subprocess.Popen([os.path.join(args.bin, "kvcached"), "--data-dir", work + "/data",
                             "--listen", "127.0.0.1:0", "--ram-bytes", str(64 << 20),
                             "--ssd-bytes", str(1 << 30), "--log-level", "warn"],
                            stdout=subprocess.PIPE, text=True)
    out: List[Dict[str, Any]] = []
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        m = re.search(r"listening on (\S+)", line)
        if not m:
            raise SystemExit(f"kvcached printed {line!r}")
        client = api.connect(m.group(1))
        for i, (model, engine, dtype, tokens, nbytes) in enumerate(rows):
            ns = client.register_keyed_namespace(f"pages-{i}", nbytes, tokens)
            page = rng.randbytes(nbytes)
            key = client.caller_keys(ns, [f"page-{i}".encode()])
            before = client.stats()["ssd_bytes"]
            client.store_keys(ns, key, page, durable=True)
            charged = client.stats()["ssd_bytes"] - before
            got = client.fetch(ns, key)
            if got.chunks != 1 or bytes(got.buffer) != page:
                raise SystemExit(f"{model} {engine} {dtype}: the page did not come back "
                                 f"byte-exact (seed {seed})")
            out.append({"model": model, "engine": engine, "dtype": dtype, "page_tokens": tokens,
                        "page_bytes": nbytes, "kv_bytes_per_token": nbytes / tokens,
                        "charged_bytes": charged, "charged_per_token": charged / tokens,
                        "charged_per_payload_byte": charged / nbytes})
        client.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps({"seed": seed, "pages": out}, indent=1))
        return 0
    print("| model | engine | KV dtype | page tokens | page bytes | KV B/token | charged B/page "
          "| charged B/token | charged / page |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in out:
        print(f"| {r['model']} | {r['engine']} | {r['dtype']} | {r['page_tokens']} | "
              f"{r['page_bytes']:,} | {r['kv_bytes_per_token']:,.0f} | {r['charged_bytes']:,} | "
              f"{r['charged_per_token']:,.0f} | {r['charged_per_payload_byte']:.4f} |")
    print(f"\n(stored and fetched byte-exact on a default kvcached; random pages, seed {seed})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
