#!/usr/bin/python3
"""Plots of `kvbench quality --json` output (docs/quality.md):

    scripts/plot_quality.py RESULT.json OUT_PREFIX

writes OUT_PREFIX-replay.png (KL of bounded replay against a cold full-depth prefill, by
replay length, per model variant, with its 95 % interval where the result has one, CED's as
the floor and SGLang's acceptance bar) and, when the result has a
decode-cost section, OUT_PREFIX-decode.png (ms per decoded token by component, by context).
"""
import json
import sys
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_replay(r: dict[str, Any], png: str) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    windows = r["windows"]
    for name, v in r["variants"].items():
        modes = v["modes"]
        xs = [w for w in windows if f"bounded_{w}_vs_full" in modes]
        mean = [modes[f"bounded_{w}_vs_full"]["kl_mean"] for w in xs]
        p99 = [modes[f"bounded_{w}_vs_full"]["kl_p99"] for w in xs]
        if all("kl_mean_ci95" in modes[f"bounded_{w}_vs_full"] for w in xs):
            # The 95 % bootstrap interval of each mean, as error bars.
            ci = [modes[f"bounded_{w}_vs_full"]["kl_mean_ci95"] for w in xs]
            err = [[m - c[0] for m, c in zip(mean, ci)], [c[1] - m for m, c in zip(mean, ci)]]
            line = ax.errorbar(xs, mean, yerr=err, fmt="o-", capsize=3,
                               label=f"{name}: mean, 95 % interval").lines[0]
        else:
            line, = ax.plot(xs, mean, "o-", label=f"{name}: mean")
        ax.plot(xs, p99, "s--", color=line.get_color(), alpha=0.6, label=f"{name}: p99")
        ax.axhline(modes["ced_vs_full"]["kl_mean"], color=line.get_color(), lw=0.8, ls=":",
                   label=f"{name}: CED (no resume)")
    ax.axvline(r["window"], color="grey", lw=0.8)
    if "sglang_kl_bar" in r:
        ax.axhline(r["sglang_kl_bar"], color="black", lw=0.8, ls="-.",
                   label="SGLang's bar (mean KL %.2g)" % r["sglang_kl_bar"])
    ax.set_yscale("log")
    ax.set_xlabel("replayed tokens W (the model's rule: W = window = %d)" % r["window"])
    ax.set_ylabel("KL(full ‖ resumed), next token")
    ax.set_title("bounded replay vs cold full-depth prefill, %d new tokens" % r["new_tokens"])
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def plot_decode(r: dict[str, Any], png: str) -> None:
    rows = r["decode_cost"]["rows"]
    labels = [f"{row['context_tokens'] // 1024}K" for row in rows]
    parts = ["attention_ms", "indexer_ms", "dense_ms", "experts_ms", "rest_ms"]
    fig, ax = plt.subplots(figsize=(7, 4))
    bottom = [0.0] * len(rows)
    for p in parts:
        vals = [row[p] for row in rows]
        ax.bar(labels, vals, bottom=bottom, label=p[:-3])
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_xlabel("context")
    ax.set_ylabel("ms per decoded token")
    ax.set_title("decode cost by component (%s, CPU)" % r["decode_cost"]["variant"])
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    with open(sys.argv[1]) as f:
        r = json.load(f)
    plot_replay(r, sys.argv[2] + "-replay.png")
    if "decode_cost" in r:
        plot_decode(r, sys.argv[2] + "-decode.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
