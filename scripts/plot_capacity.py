#!/usr/bin/env python3
"""Plots for capacity planning, from the JSON of `kvplan simulate` and `kvbench trace`.

    build/bin/kvplan simulate --trace T --config C --curve-points 12 --json > sim.json
    build/bin/kvbench trace --trace T --config C --json > replay.json
    python3 scripts/plot_capacity.py --simulate sim.json [--replay replay.json] --out DIR

Writes DIR/hit_rate_vs_capacity.png (hit rate against RAM alone and against SSD beside
the simulated RAM), DIR/layouts.png (bytes per token and SSD GB/day per cache layout) and,
with --replay, DIR/fetch_latency_vs_prefix.png. Needs python3-matplotlib.
"""
import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

GIB = 1024.0 ** 3


def hit_rate_vs_capacity(sim, out):
    curves = sim.get("curves")
    if not curves:
        raise SystemExit("the simulate JSON has no curves: run kvplan simulate --curve-points N")
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, label in (("ram_without_ssd", "RAM alone (no SSD)"),
                        ("ssd_with_this_ram",
                         f"SSD beside {sim['capacity_bytes']['ram'] / GIB:.0f} GiB RAM")):
        pts = curves[name]
        ax.plot([p["bytes"] / GIB for p in pts], [p["hit_rate"] for p in pts], marker="o",
                label=label)
    ax.axhline(sim["unlimited_hit_rate"], color="grey", linestyle="--",
               label=f"the trace's own reuse ({sim['unlimited_hit_rate']:.3f})")
    ax.set_xlabel("tier capacity (GiB)")
    ax.set_ylabel("token-weighted hit rate")
    ax.set_title(f"{os.path.basename(sim['trace']['path'])}: "
                 f"{sim['trace']['requests']} requests, {sim['chunk_tokens']}-token chunks")
    ax.set_ylim(0, max(0.05, sim["unlimited_hit_rate"] * 1.15))
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "hit_rate_vs_capacity.png"), dpi=110)


def layouts(sim, out):
    names = [l["name"] for l in sim["layouts"]]
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.8))
    a.bar(names, [l["bytes_per_token"] for l in sim["layouts"]], color="#4472c4")
    a.set_yscale("log")
    a.set_ylabel("bytes per token (log)")
    b.bar(names, [max(l["ssd_write_bytes_per_day"], 1) / 1e9 for l in sim["layouts"]],
          color="#ed7d31")
    b.set_yscale("log")
    b.set_ylabel("SSD GB written per day (log)")
    for ax in (a, b):
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("cache layouts at the same tier sizes, same trace")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "layouts.png"), dpi=110)


def fetch_latency(replay, out):
    buckets = replay["fetch_latency_by_prefix"]
    x = [b["chunks_from"] for b in buckets]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(x, [b["p50_us"] / 1e3 for b in buckets], marker="o", label="p50")
    ax.plot(x, [b["p99_us"] / 1e3 for b in buckets], marker="s", label="p99")
    ax.set_xscale("log", base=2)
    ax.set_xlabel(f"prefix length (chunks of {replay['chunk_tokens']} tokens, bucket start)")
    ax.set_ylabel("Fetch latency (ms)")
    ax.set_title("kvcached Fetch of the matched prefix, trace replay")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "fetch_latency_vs_prefix.png"), dpi=110)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--simulate", required=True, help="kvplan simulate --json output")
    p.add_argument("--replay", help="kvbench trace --json output")
    p.add_argument("--out", required=True, help="folder for the PNGs")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    with open(a.simulate) as f:
        sim = json.load(f)
    hit_rate_vs_capacity(sim, a.out)
    layouts(sim, a.out)
    if a.replay:
        with open(a.replay) as f:
            fetch_latency(json.load(f), a.out)


if __name__ == "__main__":
    main()
