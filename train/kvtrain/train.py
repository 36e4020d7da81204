"""Training a V4.1 model on the byte-level corpus (python3 -m kvtrain.train --help).

    /usr/bin/python3 -m kvtrain.train --config ../configs/small.json --out runs/small-replay \\
        --replay-aware 0.5 --minutes 60 --seed 1

Resumes from OUT/checkpoint.pt when it exists; prints step, tokens/s, loss and ETA; writes
OUT/loss.png and OUT/log.jsonl; exports OUT/model.safetensors (the engine's layout,
`kvmodel check` accepts it) with the recipe (command, seed, corpus hash, steps, loss) in
OUT/recipe.json.

What is trained: next-token cross-entropy of the trunk; each indexer towards the main
attention's choice (KL between its scores' softmax and the heads' mean attention over the
compressed entries, as DeepSeek trained V3.2's); the DSpark drafter on blocks at random
anchors (its ring from the trunk's hidden states, detached); MoE gate biases by load
balance (noaux_tc: no gradient). `--replay-aware F`: on a fraction F of the batches, each
sequence gets a random resume point P (a multiple of 64, past the window) and its windows
are cut as a resume from P cuts them — the encoder's from P − W (the bounded replay), the
decoder's from P (its segment) — so the model learns to work from a replayed state.

`--workers N`: N processes train data-parallel (gloo over loopback), each on its own batches
with one thread — on a CPU, where one process with two threads runs a step 2× slower than
with one (thousands of small operations), this is how a run uses both cores. Rank 0 keeps
the 1-worker run's data stream, decides the learning rate and when to stop, and alone
logs, evaluates, checkpoints and exports; gradients and the experts' loads are summed
over the workers each step, so every worker holds the same weights (checked at the end).

`--init W --draft-only`: a second stage for the DSpark drafter alone. The trunk is frozen
(and run without gradients), the drafter distilled from it: at many anchors per batch its
block's distributions are pulled towards the trunk's own next-token distributions at the
same positions (soft cross-entropy), which is what greedy verification accepts — a drafter
trained on the data's tokens learns the data, not the model it must agree with.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import shlex
import signal
import sys
import time
from typing import Dict, List, Optional

import numpy as np
import socket
import subprocess
import torch
import torch.distributed as dist
import torch.nn.functional as F

from . import alloc, corpus, safetensors_io, tokenizer
from .config import load_config
from .model import NEG_INF, V41, index_scores, rms_norm

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_MANIFEST = os.path.join(HERE, "..", "corpus-v2.json")


def batch_of(data: np.ndarray, rng: np.random.Generator, batch: int, seq: int) -> torch.Tensor:
    starts = rng.integers(0, len(data) - seq - 1, size=batch)
    return torch.from_numpy(np.stack([data[s:s + seq + 1] for s in starts]).astype(np.int64))


def resume_starts(rng: np.random.Generator, batch: int, seq: int, window: int):
    """Per sequence a resume point P (a multiple of 64 past the window): the encoder's
    windows start at P − W, the decoder's at P."""
    lo = (window + 63) // 64 + 1
    hi = max(lo + 1, (seq - 16) // 64)
    p = torch.from_numpy(rng.integers(lo, hi, size=batch) * 64)
    return p - window, p


def indexer_loss(aux: list, queries: int = 128) -> torch.Tensor:
    """KL(target ‖ indexer) over the visible compressed entries of up to `queries` query
    positions per layer, where target is the heads' mean attention distribution over those
    entries (detached): the indexer learns to find what attention would pick."""
    total = torch.zeros(())
    for qi, ik, wts, visible, q, main, scale in aux:
        rows = visible.any(-1).nonzero(as_tuple=True)[0]  # queries with at least one entry
        if rows.numel() == 0:
            continue
        if rows.numel() > queries:
            rows = rows[torch.randperm(rows.numel())[:queries]]
        vis = visible[rows]
        logits = torch.einsum("bnhd,bmd->bhnm", q[:, rows], main) * scale
        target = torch.softmax(logits.masked_fill(~vis[None, None], float("-inf")), -1).mean(1)
        # The sampled queries' scores, with their graph (the forward scored every query
        # without one, for the selection).
        iscore = index_scores(qi[:, rows], ik, wts[:, rows]).masked_fill(~vis[None], NEG_INF)
        logp = torch.log_softmax(iscore, dim=-1)
        kl = (target * (torch.log(target.clamp(min=1e-12)) - logp)).masked_fill(
            ~vis[None], 0.0).sum(-1)
        total = total + kl.mean()
    return total


def draft_loss(model: V41, hidden: torch.Tensor, tokens: torch.Tensor, rng: np.random.Generator,
               anchors: int, teacher: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The drafter's cross-entropy at random anchors a: block [t_a, noise…] at positions
    a…a+S−1 predicts t_{a+1}…t_{a+S}, its ring the trunk's last window before a. With
    `teacher` (the trunk's logits [B, N, V], no gradient) the targets are the trunk's own
    distributions at a…a+S−1 (soft cross-entropy) instead of the data's tokens."""
    c = model.c
    S, W = c.dspark_block_size, c.sliding_window
    B, N = tokens.shape
    losses = []
    for _ in range(anchors):
        a = int(rng.integers(W, N - S - 1))
        first = a - W
        ring = model.draft_ring(hidden[:, first:a].detach(), torch.arange(first, a))
        base = model.draft_logits(ring, tokens[:, a], a)  # [B, S, V]
        prev = tokens[:, a:a + S]  # the token before each row's target (teacher forcing)
        logits = base + model.markov_bias(prev)
        if teacher is None:
            target = tokens[:, a + 1:a + S + 1]
            losses.append(F.cross_entropy(logits.reshape(-1, c.vocab_size), target.reshape(-1)))
        else:
            soft = torch.softmax(teacher[:, a:a + S].float(), dim=-1)
            losses.append(-(soft * torch.log_softmax(logits, dim=-1)).sum(-1).mean())
    return torch.stack(losses).mean()


def is_draft_parameter(c, name: str) -> bool:
    """The DSpark drafter's own tensors (the embedding and head it shares are the trunk's)."""
    if name.startswith("dspark."):
        return True
    return name.startswith("layers.") and int(name.split(".")[1]) >= c.num_hidden_layers


def update_gate_biases(model: V41, stats: Dict[int, torch.Tensor], rate: float) -> None:
    """noaux_tc: an expert that got more than its share of tokens has its bias lowered."""
    with torch.no_grad():
        for l, load in stats.items():
            b = model.p(f"layers.{l}.ffn.gate.bias")
            b += rate * torch.sign(load.mean() - load)


def evaluate(model: V41, data: np.ndarray, seq: int, batches: int, seed: int,
             enc_start=None, dec_start=None) -> float:
    """Held-out bits per byte (one byte per token) over fixed windows of the data."""
    rng = np.random.default_rng(seed)
    total, n = 0.0, 0
    with torch.no_grad():
        for _ in range(batches):
            x = batch_of(data, rng, 2, seq)
            logits = model(x[:, :-1], enc_start=enc_start, dec_start=dec_start)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1),
                                   reduction="sum")
            total += float(loss)
            n += x[:, 1:].numel()
    return total / n / math.log(2)


def plot(log_path: str, png_path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [json.loads(l) for l in open(log_path)]
    steps = [r["step"] for r in rows if "loss" in r]
    loss = [r["loss"] / math.log(2) for r in rows if "loss" in r]
    ev = [(r["step"], r["held_out_bpb"]) for r in rows if "held_out_bpb" in r]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, loss, lw=0.8, label="train (bits/byte)")
    if ev:
        ax.plot([s for s, _ in ev], [v for _, v in ev], "o-", label="held-out (bits/byte)")
    ax.set_xlabel("step")
    ax.set_ylabel("bits per byte")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    plt.close(fig)


def init_tokens(init) -> int:
    """The tokens an --init's weights were trained on (their recipe's tokens_total; a
    recipe from before it was recorded: steps × batch × seq × workers of its chain)."""
    if not isinstance(init, dict):
        return 0
    if "tokens_total" in init:
        return int(init["tokens_total"])
    own = init.get("steps", 0) * init.get("batch", 0) * init.get("seq", 0) * init.get("workers", 1)
    return own + init_tokens(init.get("init"))


def export(model: V41, path: str, recipe: dict) -> None:
    safetensors_io.write(path, model.tensors(), {"recipe": json.dumps(recipe, sort_keys=True)})


class Workers:
    """The data-parallel group of --workers N (a no-op for 1): rank 0 is this process and
    starts the others (the same command, their rank in KVTRAIN_RANK)."""

    def __init__(self, n: int, argv: List[str]):
        self.world = n
        self.rank = int(os.environ.get("KVTRAIN_RANK", "0"))
        self.children: List[subprocess.Popen] = []
        if n == 1:
            return
        if self.rank == 0:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
            os.environ["KVTRAIN_PORT"] = str(port)
            for r in range(1, n):
                env = dict(os.environ, KVTRAIN_RANK=str(r))
                self.children.append(subprocess.Popen(
                    [sys.executable, "-m", "kvtrain.train"] + argv, env=env,
                    cwd=os.getcwd()))
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + os.environ["KVTRAIN_PORT"],
                                rank=self.rank, world_size=n)

    @property
    def lead(self) -> bool:
        return self.rank == 0

    def control(self, stop: bool, lr: float) -> tuple:
        """Rank 0's decision (stop, learning rate) for this step, on every worker."""
        if self.world == 1:
            return stop, lr
        t = torch.tensor([1.0 if stop else 0.0, lr], dtype=torch.float64)
        dist.broadcast(t, 0)
        return bool(t[0] > 0), float(t[1])

    def reduce_grads(self, params: List[torch.nn.Parameter]) -> None:
        """Every worker's gradients replaced by their mean: one flat all-reduce."""
        if self.world == 1:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat /= self.world
        at = 0
        for p, g in zip(params, grads):
            p.grad = flat[at:at + g.numel()].view_as(g)
            at += g.numel()

    def reduce_loads(self, stats: Dict[int, torch.Tensor]) -> None:
        """The experts' token counts summed over the workers (gate biases move alike)."""
        if self.world == 1 or not stats:
            return
        keys = sorted(stats)
        flat = torch.cat([stats[k].reshape(-1) for k in keys])
        dist.all_reduce(flat)
        at = 0
        for k in keys:
            n = stats[k].numel()
            stats[k] = flat[at:at + n].view_as(stats[k])
            at += n

    def check_same_weights(self, model: torch.nn.Module) -> None:
        if self.world == 1:
            return
        total = torch.tensor([sum(float(p.detach().double().sum()) for p in model.parameters())],
                             dtype=torch.float64)
        lo, hi = total.clone(), total.clone()
        dist.all_reduce(lo, op=dist.ReduceOp.MIN)
        dist.all_reduce(hi, op=dist.ReduceOp.MAX)
        if lo.item() != hi.item():
            raise SystemExit(f"workers' weights differ at the end ({lo.item()} vs {hi.item()})")

    def finish(self) -> None:
        if self.world == 1:
            return
        dist.barrier()
        dist.destroy_process_group()
        for c in self.children:
            if c.wait() != 0:
                raise SystemExit(f"worker {c.args!r} exited with {c.returncode}")


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--out", required=True, help="run folder (checkpoint, log, weights)")
    ap.add_argument("--manifest", default=DEFAULT_MANIFEST)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--seq", type=int, default=1024, help="training sequence length")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: --minutes)")
    ap.add_argument("--minutes", type=float, default=60.0, help="stop after this long")
    ap.add_argument("--replay-aware", type=float, default=0.0,
                    help="fraction of batches trained with resume-point window cuts")
    ap.add_argument("--draft-anchors", type=int, default=2)
    ap.add_argument("--init", default="", help="start from these weights (safetensors)")
    ap.add_argument("--draft-only", action="store_true",
                    help="train only the DSpark drafter, distilled from the frozen trunk")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--workers", type=int, default=1,
                    help="data-parallel processes (one thread each is fastest on a CPU)")
    ap.add_argument("--keep-freed-memory", action=argparse.BooleanOptionalAction, default=True,
                    help="keep freed memory in the heap (kvtrain/alloc.py; off: glibc's defaults)")
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--checkpoint-every", type=int, default=50)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    if args.keep_freed_memory:
        alloc.keep_freed_memory()  # before the first large tensor (kvtrain/alloc.py)
    if args.threads or args.workers > 1:
        torch.set_num_threads(args.threads or 1)  # workers: one thread each unless told
    workers = Workers(max(1, args.workers), argv)
    lead = workers.lead
    os.makedirs(args.out, exist_ok=True)
    c = load_config(args.config)
    tokenizer.check_vocab(c.vocab_size, c.dspark_noise_token_id)
    train_bytes, manifest = corpus.load(args.manifest, "train")
    held_bytes, _ = corpus.load(args.manifest, "held_out")
    train = np.array(tokenizer.encode(train_bytes), dtype=np.int32)
    held = np.array(tokenizer.encode(held_bytes), dtype=np.int32)
    torch.manual_seed(args.seed)
    model = V41(c, init_seed=args.seed)
    if args.init:
        model.load_tensors(safetensors_io.read(args.init))
    if args.draft_only:
        if c.num_nextn_predict_layers == 0:
            raise SystemExit(f"--draft-only: {args.config} has no DSpark draft layers")
        for name in model.names:
            if not is_draft_parameter(c, name):
                model.p(name).requires_grad_(False)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr,
                            betas=(0.9, 0.95), weight_decay=0.01)
    # Separate streams: the data are the same batches in both variants whatever the
    # replay draws take.
    # Rank 0's streams are the 1-worker run's; the others draw their own batches.
    def streams(*at: int):
        r = workers.rank
        tag = [r + 100] if r else []
        return (np.random.default_rng([args.seed, *at] + tag if at or r else args.seed),
                np.random.default_rng([args.seed, *at, 1] + tag),
                np.random.default_rng([args.seed, *at, 2] + tag))

    rng, replay_rng, draft_rng = streams()
    ckpt = os.path.join(args.out, "checkpoint.pt")
    log_path = os.path.join(args.out, "log.jsonl")
    step, elapsed, tokens = 0, 0.0, 0
    if os.path.exists(ckpt):
        st = torch.load(ckpt)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        step, elapsed = st["step"], st["elapsed"]
        # (a checkpoint from before tokens were counted: as if every step had this run's size)
        tokens = st.get("tokens", step * args.batch * args.seq * workers.world)
        rng, replay_rng, draft_rng = streams(step)
        if lead:
            print(f"resumed at step {step} ({elapsed / 60:.1f} min trained)", flush=True)
    budget = args.minutes * 60.0
    tokens_per_step = args.batch * args.seq * workers.world
    t0 = time.time() - elapsed
    first_step, started = step, time.time()  # tokens/s of this process's own steps
    last_loss = float("nan")
    # SIGTERM / SIGINT end the run at the next step's end: checkpoint, evaluation and
    # export as at the budget's end, so a stopped run resumes where it stopped.
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(True))
    while True:
        elapsed = time.time() - t0
        done = bool((args.steps and step >= args.steps) or (not args.steps and elapsed >= budget)
                    or stop)
        frac = step / args.steps if args.steps else elapsed / budget
        lr = args.lr * min(1.0, (step + 1) / 50) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))
        done, lr = workers.control(done, lr)
        if done:
            break
        for g in opt.param_groups:
            g["lr"] = lr
        x = batch_of(train, rng, args.batch, args.seq)
        enc_start = dec_start = None
        if args.replay_aware > 0 and replay_rng.random() < args.replay_aware:
            enc_start, dec_start = resume_starts(replay_rng, args.batch, args.seq,
                                                 c.sliding_window)
        aux: list = []
        stats: Dict[int, torch.Tensor] = {}
        if args.draft_only:
            with torch.no_grad():
                logits, hidden = model(x[:, :-1], want_hidden=True)
            lm = draft_loss(model, hidden, x, draft_rng, args.draft_anchors, teacher=logits)
            loss = lm
        else:
            want = c.num_nextn_predict_layers > 0 and args.draft_anchors > 0
            out = model(x[:, :-1], enc_start=enc_start, dec_start=dec_start, aux=aux,
                        stats=stats, want_hidden=want)
            logits, hidden = out if want else (out, None)
            lm = F.cross_entropy(logits.reshape(-1, c.vocab_size), x[:, 1:].reshape(-1))
            loss = lm + 0.1 * indexer_loss(aux)
            if want:
                loss = loss + 0.5 * draft_loss(model, hidden, x, draft_rng, args.draft_anchors)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        workers.reduce_grads([p for p in model.parameters() if p.requires_grad])
        workers.reduce_loads(stats)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if not args.draft_only:
            update_gate_biases(model, stats, 1e-3)
        step += 1
        tokens += tokens_per_step  # the worker count may change between resumes
        last_loss = float(lm)  # the drafter's distillation loss with --draft-only
        elapsed = time.time() - t0
        if not lead:
            continue
        rec = {"step": step, "loss": last_loss, "lr": lr, "elapsed_s": round(elapsed, 1),
               "replay": enc_start is not None}
        if step % args.eval_every == 0:
            rec["held_out_bpb"] = evaluate(model, held, args.seq, 2, 1234)
        with open(log_path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        tps = (step - first_step) * tokens_per_step / max(time.time() - started, 1e-9)
        left = (args.steps - step) * elapsed / step if args.steps else budget - elapsed
        print(f"step {step}  loss {last_loss:.3f} ({last_loss / math.log(2):.3f} bits/byte)  "
              f"{tps:.0f} tok/s  ETA {left / 60:.1f} min"
              + (f"  held-out {rec['held_out_bpb']:.3f} bits/byte" if "held_out_bpb" in rec else ""),
              flush=True)
        if step % args.checkpoint_every == 0:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                        "elapsed": elapsed, "tokens": tokens}, ckpt + ".tmp")
            os.replace(ckpt + ".tmp", ckpt)
    workers.check_same_weights(model)
    if not lead:
        workers.finish()
        return 0
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                "elapsed": time.time() - t0, "tokens": tokens}, ckpt + ".tmp")
    os.replace(ckpt + ".tmp", ckpt)
    bpb = evaluate(model, held, args.seq, 8, 1234)
    recipe = {"command": "python3 -m kvtrain.train " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:])),
              "seed": args.seed, "corpus_sha256": manifest["corpus_sha256"], "steps": step,
              "train_loss_bits_per_byte": last_loss / math.log(2), "held_out_bits_per_byte": bpb,
              "replay_aware": args.replay_aware, "seq": args.seq, "batch": args.batch,
              "config": os.path.basename(args.config), "minutes": round((time.time() - t0) / 60, 1),
              "workers": workers.world, "tokens": tokens}
    if args.draft_only:
        # The trunk is the init's: its recipe stays the record of how it was trained.
        recipe["draft_distill_loss"] = recipe.pop("train_loss_bits_per_byte") * math.log(2)
        recipe["draft_anchors"] = args.draft_anchors
    if args.init:
        init_recipe = safetensors_io.metadata(args.init).get("recipe")
        recipe["init"] = json.loads(init_recipe) if init_recipe else os.path.basename(args.init)
    # Every run's tokens, this one's and its init chain's: what the weights have seen.
    recipe["tokens_total"] = recipe["tokens"] + init_tokens(recipe.get("init"))
    export(model, os.path.join(args.out, "model.safetensors"), recipe)
    with open(os.path.join(args.out, "recipe.json"), "w") as f:
        json.dump(recipe, f, indent=1)
        f.write("\n")
    plot(log_path, os.path.join(args.out, "loss.png"))
    print(json.dumps(recipe), flush=True)
    workers.finish()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
