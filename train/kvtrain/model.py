"""DeepSeek V4.1 Flash in PyTorch, for training: every mechanism the C++ engine runs
(engine/model/), with the same math, so weights trained here run there unchanged.

Read it top to bottom: `V41.forward` embeds, runs the trunk's layers (Engram before its
layers, then mHC around attention and MoE), and ends in the head; the DSpark drafter is
`V41.draft`. The engine is the reference at inference; this module is held to it by
train/tests/test_agreement.py (the same logits on the same weights).

Sequences are processed whole (every position at once, as training needs). The sliding
window of a layer group can start late (`enc_start`, `dec_start`): a query at i ≥ start
sees window keys in [max(start, i − W + 1), i] — what CED prefill does to the decoder
(its window starts at the segment it runs on) and bounded replay to both.

Shapes: B sequences, N positions, D model width, hc stream copies, H heads of hd.
"""
from __future__ import annotations

import math
from typing import Dict, List, NamedTuple, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from . import kernels
from .config import FULL, REINDEX, Config, parameter_shapes
from .quant import fake_quant

NEG_INF = float("-inf")


# ---------------------------------------------------------------------------------------
# Small ops


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_frequencies(rd: int, base: float, original: int, factor: float, beta_fast: float,
                     beta_slow: float) -> np.ndarray:
    half = rd // 2
    f = np.array([base ** (-2.0 * i / rd) for i in range(half)], dtype=np.float64)
    if original > 0:
        def corr(r: float) -> float:
            return rd * math.log(original / (2.0 * math.pi * r)) / (2.0 * math.log(base))
        low = max(math.floor(corr(beta_fast)), 0.0)
        high = min(math.ceil(corr(beta_slow)), float(rd - 1))
        for i in range(half):
            ramp = min(max((i - low) / max(high - low, 1e-3), 0.0), 1.0)
            f[i] = f[i] / factor * ramp + f[i] * (1.0 - ramp)
    return f


def rope_tables(freqs: np.ndarray, positions: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [..., half] (angles in double, then float, as the engine)."""
    ang = positions.to(torch.float64)[..., None] * torch.from_numpy(freqs)
    return torch.cos(ang).float(), torch.sin(ang).float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               inverse: bool = False) -> torch.Tensor:
    """Rotate the last 2·half values of x in pairs (2i, 2i+1); cos/sin broadcast over x's
    leading dims except the last."""
    rd = cos.shape[-1] * 2
    head, tail = x[..., :-rd], x[..., -rd:]
    a, b = tail[..., 0::2], tail[..., 1::2]
    s = -sin if inverse else sin
    ra = a * cos - b * s
    rb = a * s + b * cos
    rot = torch.stack([ra, rb], dim=-1).flatten(-2)
    return torch.cat([head, rot], dim=-1)


def sqrt_softplus(x: torch.Tensor) -> torch.Tensor:
    return torch.sqrt(F.softplus(x))


def topk_mask(scores: torch.Tensor, k: int) -> torch.Tensor:
    """A 0/1 mask of the k largest scores along the last dim, ties to the lower index — the
    set a stable descending sort's first k give, without sorting every row: torch.topk finds
    the k-th value, every larger score is in, and of the scores equal to it the first ones
    by index fill the rest. k ≤ the last dim."""
    thr = torch.topk(scores, k, dim=-1, sorted=False).values.amin(-1, keepdim=True)
    above = scores > thr
    tied = scores == thr
    need = k - above.sum(-1, keepdim=True)
    # (an int32 running count: the default int64 one of a bool is 10× slower)
    return above | (tied & (torch.cumsum(tied, dim=-1, dtype=torch.int32) <= need))


def topk_indices(scores: torch.Tensor, k: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """The k best finite scores' indices along the last dim (ties to the lower index) and
    whether each is a real pick (fewer than k finite scores leave the rest unused), in the
    order of a stable descending sort."""
    k = min(k, scores.shape[-1])
    if k == 0:
        empty = scores[..., :0]
        return empty.long(), empty != NEG_INF
    mask = topk_mask(scores, k)
    # Exactly k per row, in index order; then ordered by score (stable: ties stay by index).
    idx = mask.nonzero(as_tuple=True)[-1].reshape(*scores.shape[:-1], k)
    vals = scores.gather(-1, idx)
    order = torch.sort(vals, dim=-1, descending=True, stable=True).indices
    idx, vals = idx.gather(-1, order), vals.gather(-1, order)
    return idx, vals != NEG_INF


def topk_ascending(scores: torch.Tensor, k: int) -> torch.Tensor:
    """A 0/1 mask of the k best finite scores along the last dim; ties go to the lower
    index (the engine's TopKAscending)."""
    k = min(k, scores.shape[-1])
    if k == 0:
        return torch.zeros_like(scores, dtype=torch.bool)
    return topk_mask(scores, k) & (scores != NEG_INF)


_scratch: Dict[Tuple[Tuple[int, ...], torch.dtype], torch.Tensor] = {}


def _zeroed_scratch(shape: Tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zeroed buffer reused across calls of one shape: a fresh 32 MB tensor per backward
    costs more in page faults than the product it feeds."""
    buf = _scratch.get((shape, dtype))
    if buf is None:
        buf = _scratch[(shape, dtype)] = torch.empty(shape, dtype=dtype)
    return buf.zero_()


class _SelectedRows(torch.autograd.Function):
    """Products of per-query rows [B, N, H, X] with the k rows of `main` [B, Nc, hd] each
    query selected (idx [B, N, k]): forward "keys" — rows · selectedᵀ → [B, N, H, k] (the
    scores) — or "values" — rows [.., k] · selected → [B, N, H, hd] (the output).

    The same as gathering the selected rows [B, N, k, hd] and multiplying, but the gradient
    for `main` never goes through that gathered tensor: the per-query factors are scattered
    into a dense [B, N·H, Nc] block and multiplied with one GEMM per batch row. Autograd
    would instead run B·N products with inner dimension H (4) and add the two uses'
    [B, N, k, hd] gradients; on a CPU core that was a third of a training step."""

    @staticmethod
    def forward(ctx, rows: torch.Tensor, main: torch.Tensor,  # type: ignore[override]
                idx: torch.Tensor, keys: bool) -> torch.Tensor:
        B, Nc, hd = main.shape
        N, k = idx.shape[1], idx.shape[2]
        flat = (idx + torch.arange(B).view(B, 1, 1) * Nc).reshape(-1)
        sel = main.reshape(B * Nc, hd)[flat].reshape(B * N, k, hd)
        r = rows.reshape(B * N, rows.shape[2], rows.shape[3])
        out = torch.bmm(r, sel.transpose(1, 2)) if keys else torch.bmm(r, sel)
        ctx.save_for_backward(rows, main, idx, sel)
        ctx.keys = keys
        return out.reshape(B, N, rows.shape[2], -1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        rows, main, idx, sel = ctx.saved_tensors
        B, Nc, hd = main.shape
        N, H, k = idx.shape[1], rows.shape[2], idx.shape[2]
        g = grad.reshape(B * N, H, -1)
        if ctx.keys:  # out = rows · selᵀ: rows [.., H, hd], g [.., H, k]
            grad_rows = torch.bmm(g, sel)
            weights, other = g, rows  # d main[m] += Σ g[n, h, j] rows[n, h] where idx = m
        else:  # out = rows · sel: rows [.., H, k], g [.., H, hd]
            grad_rows = torch.bmm(g, sel.transpose(1, 2))
            weights, other = rows.reshape(B * N, H, k), g  # d main[m] += Σ rows[n, h, j] g[n, h]
        dense = _zeroed_scratch((B, N, H, Nc), grad.dtype)
        dense.scatter_add_(-1, idx[:, :, None, :].expand(B, N, H, k),
                           weights.reshape(B, N, H, k))
        grad_main = torch.bmm(dense.reshape(B, N * H, Nc).transpose(1, 2),
                              other.reshape(B, N * H, hd))
        return grad_rows.reshape(rows.shape), grad_main, None, None


def selected_scores(q: torch.Tensor, main: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """q [B, N, H, hd] against each query's selected rows of main: [B, N, H, k] (the fused
    kernel when it runs here, else _SelectedRows)."""
    f = kernels.SelectedRows if kernels.usable(q, main) else _SelectedRows
    return f.apply(q, main, idx, True)


def selected_values(p: torch.Tensor, main: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Weights p [B, N, H, k] of each query's selected rows of main: [B, N, H, hd]."""
    f = kernels.SelectedRows if kernels.usable(p, main) else _SelectedRows
    return f.apply(p, main, idx, False)


def index_scores(qi: torch.Tensor, ik: torch.Tensor, wts: torch.Tensor) -> torch.Tensor:
    """The indexer's scores [B, n, Nc]: Σ_heads w_h · relu(q_h · k) for queries qi
    [B, n, IH, Id] with head weights wts [B, n, IH] against index keys ik [B, Nc, Id]."""
    # One GEMM per batch row, then the heads' weighted sum as IH multiply-adds over
    # [B, n, Nc] (in place without a graph): 85 → 15 ms on [2, 1024] × 1,024 entries, where
    # einsum's layout made the relu, product and sum over heads strided passes.
    B, n, IH, Id = qi.shape
    dots = torch.bmm(qi.reshape(B, n * IH, Id), ik.transpose(1, 2)).view(B, n, IH, -1)
    graph = torch.is_grad_enabled() and (qi.requires_grad or ik.requires_grad or wts.requires_grad)
    dots = F.relu(dots) if graph else dots.relu_()
    out = dots[:, :, 0] * wts[:, :, 0, None]
    for h in range(1, IH):
        if graph:
            out = out + dots[:, :, h] * wts[:, :, h, None]
        else:
            out.addcmul_(dots[:, :, h], wts[:, :, h, None])
    return out


class IndexerInputs(NamedTuple):
    """What the indexer's training loss needs from one layer: its queries, keys and head
    weights (with their graphs), which entries each query sees [N, Nc], and the main
    attention's queries and entries (detached: the target)."""
    qi: torch.Tensor
    ik: torch.Tensor
    wts: torch.Tensor
    visible: torch.Tensor
    q: torch.Tensor
    main: torch.Tensor
    scale: float


# ---------------------------------------------------------------------------------------
# mHC


def hc_coefficients(m: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, hc: int,
                    iters: int, eps: float) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """pre [.., hc], post [.., hc], comb [.., hc, hc] from scaled mixes m [.., (2+hc)·hc]."""
    pre = torch.sigmoid(m[..., :hc] * scale[0] + base[:hc]) + eps
    post = 2.0 * torch.sigmoid(m[..., hc:2 * hc] * scale[1] + base[hc:2 * hc])
    C = (m[..., 2 * hc:] * scale[2] + base[2 * hc:]).reshape(*m.shape[:-1], hc, hc)
    return pre, post, sinkhorn(C, iters, eps)


def sinkhorn_reference(C: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """comb from its logits C [.., hc, hc]: a row softmax (+ eps), then `iters` alternating
    normalizations — the first of columns only, then rows and columns — as the engine's
    HcSinkhorn. The plain PyTorch form (autograd through every step); `sinkhorn` is the
    same math with its own backward."""
    C = torch.softmax(C, dim=-1) + eps
    for it in range(max(iters, 1)):
        if it > 0:  # rows, then columns; the first step normalizes columns only
            C = C / (C.sum(-1, keepdim=True) + eps)
        C = C / (C.sum(-2, keepdim=True) + eps)
    return C


class _Sinkhorn(torch.autograd.Function):
    """sinkhorn_reference with the token axis last ([hc, hc, T]: each sum over a row or a
    column adds hc contiguous vectors of T instead of reducing T rows of hc values) and a
    backward written out: each step y = x / (Σ_axis x + eps) gives
    dx = (dy − Σ_axis(dy · y)) / (Σ_axis x + eps). Autograd through the reference form ran
    ~250 operations on [T, hc, hc] per call, each a reduction over 4 values — 30 ms of a
    layer's 110 (docs/quality.md, "Training throughput")."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, iters: int, eps: float) -> torch.Tensor:  # type: ignore[override]
        shape = logits.shape
        hc = shape[-1]
        z = logits.reshape(-1, hc, hc).permute(1, 2, 0)  # [row, col, T]
        z = z - z.amax(1, keepdim=True)
        e = torch.exp(z)
        P = e / e.sum(1, keepdim=True)  # softmax over each row's columns
        C = P + eps
        steps = []  # (axis, y, divisor) of each normalization
        for it in range(max(iters, 1)):
            for axis in ((1, 0) if it > 0 else (0,)):  # rows (sum over columns), columns
                d = C.sum(axis, keepdim=True) + eps
                C = C / d
                steps.append((axis, C, d))
        ctx.steps = steps
        ctx.save_for_backward(P)
        ctx.shape = shape
        return C.permute(2, 0, 1).reshape(shape)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        (P,) = ctx.saved_tensors
        hc = ctx.shape[-1]
        g = grad.reshape(-1, hc, hc).permute(1, 2, 0)
        for axis, y, d in reversed(ctx.steps):
            g = (g - (g * y).sum(axis, keepdim=True)) / d
        g = P * (g - (g * P).sum(1, keepdim=True))  # the softmax's backward
        return g.permute(2, 0, 1).reshape(ctx.shape), None, None


def sinkhorn(C: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    if kernels.usable(C) and C.shape[-1] <= 8:
        return kernels.Sinkhorn.apply(C, iters, eps)
    return _Sinkhorn.apply(C, iters, eps)


def hc_mixes(X: torch.Tensor, fn: torch.Tensor) -> torch.Tensor:
    """(fn · vec X) · rsqrt(mean(vec X²) + 1e-20) for X [.., hc, D]."""
    v = X.flatten(-2)
    return (v @ fn.t()) * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + 1e-20)


def hc_pre(X: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    return (a[..., :, None] * X).sum(-2)


def hc_post(f: torch.Tensor, R: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    # out[k] = post[k]·f + Σ_j comb[j][k]·R[j]. The fused kernel: one pass per token (1.8 ms
    # forward and backward on [2, 1024, 4, 128] against 15.9 for the form below).
    shapes_agree = (f.shape[:-1] == R.shape[:-2] == post.shape[:-1] == comb.shape[:-2])
    if shapes_agree and kernels.usable(f, R, post, comb):
        return kernels.HcPost.apply(f, R, post, comb)
    return hc_post_reference(f, R, post, comb)


def hc_post_reference(f: torch.Tensor, R: torch.Tensor, post: torch.Tensor,
                      comb: torch.Tensor) -> torch.Tensor:
    # One batched product per token (einsum's bmm), 1.7× faster forward and backward than
    # hc broadcast terms (16.9 → 10.1 ms on [2, 1024, 4, 128]), whose backward reduced over
    # D once per term.
    return post[..., :, None] * f[..., None, :] + torch.einsum("...jk,...jd->...kd", comb, R)


# ---------------------------------------------------------------------------------------
# Engram hashing (tokens only: precomputed with numpy, uint64 wrapping as in the engine)


def engram_rows(c: Config, slot: int, tokens: np.ndarray) -> np.ndarray:
    """Table rows [B, N, orders·heads] of every position (engine: EngramRows)."""
    mult = [np.uint64(m & 0xFFFFFFFFFFFFFFFF) for m in c.engram_multipliers[slot]]
    primes = c.engram_primes[slot]
    offsets = np.concatenate([[0], np.cumsum(primes)[:-1]]).astype(np.int64)
    heads = c.engram_n_heads
    cv = c.engram_compressed_vocab_size
    toks = tokens.astype(np.int64) % cv
    pad = c.engram_pad_token_id % cv
    B, N = toks.shape
    rows = np.zeros((B, N, (len(mult) - 1) * heads), dtype=np.int64)
    with np.errstate(over="ignore"):
        h = np.zeros((B, N), dtype=np.uint64)
        for k in range(len(mult)):
            shifted = np.full((B, N), pad, dtype=np.int64)
            if k < N:
                shifted[:, k:] = toks[:, :N - k]
            term = shifted.astype(np.uint64) * mult[k]
            h = term if k == 0 else h ^ term
            if k == 0:
                continue
            hs = h.view(np.int64)
            for j in range(heads):
                slot_i = (k - 1) * heads + j
                p = primes[slot_i]
                # C++: r = (int64) h % p, then + p if negative == Python's floor mod.
                r = np.mod(hs, p)
                rows[:, :, slot_i] = r + offsets[slot_i]
    return rows


# ---------------------------------------------------------------------------------------
# The model


class V41(torch.nn.Module):
    def __init__(self, c: Config, init_seed: Optional[int] = None):
        super().__init__()
        self.c = c
        self.names: List[str] = []
        self.params = torch.nn.ParameterDict()
        g = torch.Generator().manual_seed(init_seed or 0)
        for name, shape in parameter_shapes(c):
            self.names.append(name)
            self.params[self._key(name)] = torch.nn.Parameter(self._init(name, shape, g))
        rd = c.qk_rope_head_dim
        self.freqs = []
        for l in range(c.total_layers):
            compressed = c.compress_ratios[l] > 0
            self.freqs.append(rope_frequencies(
                rd, c.compress_rope_theta if compressed else c.rope_theta,
                c.rope_original if compressed else 0, c.rope_factor, c.beta_fast, c.beta_slow))
        # noaux_tc: the gate biases are moved by load balance, not by gradients.
        for name in self.names:
            if name.endswith("gate.bias"):
                self.p(name).requires_grad_(False)

    @staticmethod
    def _key(name: str) -> str:
        return name.replace(".", "__")

    def p(self, name: str) -> torch.Tensor:
        return self.params[self._key(name)]

    def has(self, name: str) -> bool:
        return self._key(name) in self.params

    def _init(self, name: str, shape: tuple, g: torch.Generator) -> torch.Tensor:
        c = self.c
        hc = c.hc_mult
        if name.endswith("_base"):
            t = torch.zeros(shape)
            for j in range(hc):
                t[2 * hc + j * hc + j] = 4.0
            return t
        if name.endswith("_scale"):
            return torch.ones(shape)
        if len(shape) == 1 or name.endswith(".qw") or name.endswith(".kw"):
            if name.endswith("attn_sink"):
                return torch.zeros(shape)
            if name.endswith("gate.bias"):
                return torch.zeros(shape)
            return torch.ones(shape)
        if name.endswith("_fn"):
            return torch.randn(shape, generator=g) * (0.1 / math.sqrt(shape[1]))
        if name == "embed.weight" or name.endswith("engram.table") or name.endswith("markov.embed"):
            return torch.randn(shape, generator=g)
        std = 1.0 / math.sqrt(shape[1])
        if name.endswith("wo_b.weight") or name.endswith("w2.weight"):
            std /= math.sqrt(2.0 * c.num_hidden_layers)
        return torch.randn(shape, generator=g) * std

    # ---- weights in and out ----

    def load_tensors(self, tensors: Dict[str, torch.Tensor]) -> None:
        missing = [n for n in self.names if n not in tensors]
        if missing:
            raise ValueError(f"weights lack {len(missing)} tensors, first {missing[0]}")
        with torch.no_grad():
            for n in self.names:
                t = tensors[n]
                if tuple(t.shape) != tuple(self.p(n).shape):
                    raise ValueError(f"tensor {n} is {tuple(t.shape)}, the config wants "
                                     f"{tuple(self.p(n).shape)}")
                self.p(n).copy_(t)

    def tensors(self) -> Dict[str, torch.Tensor]:
        return {n: self.p(n).detach().clone() for n in self.names}

    # ---- pieces ----

    def _linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return x @ self.p(name).t()

    def _engram(self, l: int, X: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        c = self.c
        pfx = f"layers.{l}.engram."
        B, N = rows.shape[:2]
        E = self.p(pfx + "table")[rows].reshape(B, N, -1)
        kv = self._linear(E, pfx + "wkv.weight").reshape(B, N, c.hc_mult + 1, c.hidden_size)
        K, V = kv[:, :, :c.hc_mult], kv[:, :, c.hc_mult]
        qw, kw = self.p(pfx + "qw"), self.p(pfx + "kw")
        D = c.hidden_size
        dot = (X * qw * kw * K).sum(-1)
        s = dot * torch.rsqrt(X.pow(2).mean(-1) + 1e-20) * torch.rsqrt(K.pow(2).mean(-1) + 1e-20) \
            / math.sqrt(D)
        gate = torch.sigmoid(torch.sign(s) * torch.sqrt(torch.clamp(s.abs(), min=1e-6)))
        return X + gate[..., None] * V[:, :, None, :]

    def _window_scores(self, q: torch.Tensor, kv: torch.Tensor, start: Optional[torch.Tensor],
                       first_position: int, scale: float):
        """Scores of each query against the window keys of its block: [B, H, nb, Wb, 2Wb]
        (−inf outside its window), the keys per block [B, nb, 2Wb, hd], nb and Wb."""
        B, N, H, hd = q.shape
        Wb = self.c.sliding_window
        nb = (N + Wb - 1) // Wb
        qp = F.pad(q, (0, 0, 0, 0, 0, nb * Wb - N)).reshape(B, nb, Wb, H, hd)
        kp = F.pad(kv, (0, 0, Wb, nb * Wb - N))  # W rows before position 0
        kb = kp.unfold(1, 2 * Wb, Wb).transpose(-1, -2)  # [B, nb, 2Wb, hd]
        sc = torch.einsum("bxqhd,bxmd->bhxqm", qp, kb) * scale
        i = (torch.arange(nb)[:, None, None] * Wb + torch.arange(Wb)[None, :, None])
        p = (torch.arange(nb)[:, None, None] * Wb - Wb + torch.arange(2 * Wb)[None, None, :])
        ok = (p <= i) & (p > i - Wb) & (p >= 0) & (p < N)  # [nb, Wb, 2Wb]
        ok = ok[None].expand(B, nb, Wb, 2 * Wb)
        if start is not None:
            st = start.view(B, 1, 1, 1) - first_position
            ok = ok & ((i[None] < st) | (p[None] >= st))
        return sc.masked_fill(~ok[:, None], NEG_INF), kb, nb, Wb

    def _compress(self, l: int, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """A Full layer's entries for every complete group of x [B, N, D]: the main KV
        [B, Nc, hd] and the index keys [B, Nc, Id], rotated and rounded as in the pages."""
        c = self.c
        ratio = c.compress_ratios[l]
        a = f"layers.{l}.attn."
        B, N, _ = x.shape
        Nc = N // ratio
        kv = self._linear(x[:, :Nc * ratio], a + "compressor.wkv.weight")
        if ratio > 1:
            sc = self._linear(x[:, :Nc * ratio], a + "compressor.wgate.weight")
            kv = kv.reshape(B, Nc, ratio, c.head_dim)
            sc = sc.reshape(B, Nc, ratio, c.head_dim)
            latent = (kv * torch.softmax(sc, dim=2)).sum(2)
        else:
            latent = kv
        latent = rms_norm(latent, self.p(a + "compressor.norm.weight"), c.rms_norm_eps)
        keys = rms_norm(self._linear(latent, a + "indexer.wk.weight"),
                        self.p(a + "indexer.k_norm.weight"), c.rms_norm_eps)
        cos, sin = rope_tables(self.freqs[l], torch.arange(Nc) * ratio)
        keys = fake_quant(apply_rope(keys, cos, sin), "index")
        main = fake_quant(apply_rope(latent, cos, sin), "main")
        return main, keys

    def _attention(self, l: int, x: torch.Tensor, first_position: int,
                   window_start: Optional[torch.Tensor], state: dict,
                   aux: Optional[list]) -> torch.Tensor:
        c = self.c
        plan = c.layers[l]
        a = f"layers.{l}.attn."
        B, N, D = x.shape
        H, hd, rd = c.num_attention_heads, c.head_dim, c.qk_rope_head_dim
        pos = torch.arange(N) + first_position
        cos, sin = rope_tables(self.freqs[l], pos)
        qr = rms_norm(self._linear(x, a + "wq_a.weight"), self.p(a + "q_norm.weight"),
                      c.rms_norm_eps)
        q = self._linear(qr, a + "wq_b.weight").reshape(B, N, H, hd)
        q = apply_rope(q, cos[:, None, :], sin[:, None, :])
        kv = rms_norm(self._linear(x, a + "wkv.weight"), self.p(a + "kv_norm.weight"),
                      c.rms_norm_eps)
        kv = fake_quant(apply_rope(kv, cos, sin), "swa")
        scale = 1.0 / math.sqrt(hd)
        # The window, banded: queries in blocks of W see the 2W keys from W before their
        # block's start (only what a window can reach, not all N).
        scores_w, kv_blocks, nb, Wb = self._window_scores(q, kv, window_start, first_position,
                                                          scale)
        scores_c: Optional[torch.Tensor] = None
        picked: Optional[Tuple[torch.Tensor, torch.Tensor]] = None  # (main, idx)
        if plan.ratio > 0:
            ratio = plan.ratio
            if plan.mode == FULL:
                if l not in state["entries"]:
                    state["entries"][l] = self._compress(l, x)
            main, keys = state["entries"][plan.kv_layer]
            Nc = main.shape[1]
            visible = (torch.arange(Nc)[None, :] < ((pos[:, None] + 1) // ratio))  # [N, Nc]
            if plan.runs_indexer:
                IH, Id = c.index_n_heads, c.index_head_dim
                qi = self._linear(qr, a + "indexer.wq_b.weight").reshape(B, N, IH, Id)
                qi = fake_quant(apply_rope(qi, cos[:, None, :], sin[:, None, :]), "index")
                wts = self._linear(x, a + "indexer.weights_proj.weight") * \
                    (1.0 / math.sqrt(Id) / math.sqrt(IH))
                ik = state["entries"][plan.index_k_layer][1]
                # Selection needs every query's scores but no gradient (top-k picks are
                # not differentiable); the indexer's own loss scores its sampled queries
                # again with one (train.indexer_loss), so no [B, N, IH, Nc] tensor is kept
                # for a backward pass.
                with torch.no_grad():
                    sel_scores = index_scores(qi, ik, wts).masked_fill(~visible[None], NEG_INF)
                if plan.is_candidate_source:
                    state["pool"] = self._candidate_pool(sel_scores, pos, ratio)
                elif plan.candidate_pool_layer >= 0:
                    sel_scores = sel_scores.masked_fill(~state["pool"], NEG_INF)
                state["selected"][l] = topk_indices(sel_scores, c.index_topk)
                if aux is not None:
                    aux.append(IndexerInputs(qi, ik, wts, visible, q.detach(), main.detach(),
                                             scale))
            idx, ok = state["selected"][plan.topk_layer]  # [B, N, k]
            picked = (main, idx)
            scores_c = selected_scores(q, main, idx).permute(0, 2, 1, 3) * scale
            scores_c = scores_c.masked_fill(~ok[:, None], NEG_INF)
        sink = self.p(a + "attn_sink").view(1, H, 1, 1).expand(B, H, N, 1)
        parts = [scores_w.reshape(B, H, nb * Wb, 2 * Wb)[:, :, :N]]
        if scores_c is not None:
            parts.append(scores_c)
        allsc = torch.cat(parts + [sink], dim=-1)
        probs = torch.softmax(allsc, dim=-1)[..., :-1]
        pw = F.pad(probs[..., :2 * Wb], (0, 0, 0, nb * Wb - N)).reshape(B, H, nb, Wb, 2 * Wb)
        o = torch.einsum("bhxqm,bxmd->bxqhd", pw, kv_blocks).reshape(B, nb * Wb, H, hd)[:, :N]
        if picked is not None:
            o = o + selected_values(probs[..., 2 * Wb:].permute(0, 2, 1, 3).contiguous(), *picked)
        return self._output(a, o, cos, sin)

    def _output(self, a: str, o: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """What follows attention: the inverse RoPE of each head's output [B, N, H, hd], then
        the grouped low-rank projection (wo_a per group of heads, then wo_b)."""
        c = self.c
        B, N, H, hd = o.shape
        o = apply_rope(o, cos[:, None, :], sin[:, None, :], inverse=True)
        G, ol = c.o_groups, c.o_lora_rank
        gw = H * hd // G
        wo_a = self.p(a + "wo_a.weight").reshape(G, ol, gw)
        u = torch.einsum("bngw,gow->bngo", o.reshape(B, N, G, gw), wo_a).reshape(B, N, G * ol)
        return self._linear(u, a + "wo_b.weight")

    def _candidate_pool(self, scores: torch.Tensor, pos: torch.Tensor, ratio: int) -> torch.Tensor:
        """[B, N, Nc] mask: per query, the best candidate_topk_blocks blocks of
        candidate_block_size entries (block max), the newest visible block always kept."""
        c = self.c
        blk = c.candidate_block_size
        B, N, Nc = scores.shape
        nb = (Nc + blk - 1) // blk
        padded = F.pad(scores, (0, nb * blk - Nc), value=NEG_INF)
        best = padded.reshape(B, N, nb, blk).amax(-1)
        cl = (pos + 1) // ratio  # visible entries per query
        newest = torch.where(cl > 0, (cl - 1) // blk, torch.full_like(cl, -1))
        pin = (torch.arange(nb)[None, :] == newest[:, None])  # [N, nb]
        best = best.masked_fill(pin[None], float("inf"))
        keep = topk_ascending(best, c.candidate_topk_blocks)  # [B, N, nb]
        mask = keep.repeat_interleave(blk, dim=-1)[..., :Nc]
        visible = torch.arange(Nc)[None, :] < cl[:, None]
        return mask & visible[None]

    def _moe(self, l: int, x: torch.Tensor, stats: Optional[dict]) -> torch.Tensor:
        c = self.c
        f = f"layers.{l}.ffn."
        E, k = c.experts_of(l), c.top_k_of(l)
        shape = x.shape
        xf = x.reshape(-1, shape[-1])
        score = sqrt_softplus(self._linear(xf, f + "gate.weight"))
        biased = (score + self.p(f + "gate.bias")).detach()
        pick = topk_ascending(biased, k)  # [T, E]
        w = score * pick
        if c.norm_topk_prob:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        w = w * c.routed_scaling_factor
        if stats is not None:
            stats.setdefault(l, torch.zeros(E))
            stats[l] += pick.sum(0).float()
        out = torch.zeros_like(xf)
        lim = c.swiglu_limit

        def expert(pfx: str, xs: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
            g = torch.clamp(self._linear(xs, pfx + "w1.weight"), max=lim)
            u = torch.clamp(self._linear(xs, pfx + "w3.weight"), -lim, lim)
            return self._linear(weight[:, None] * F.silu(g) * u, pfx + "w2.weight")

        for e in range(E):
            rows = pick[:, e].nonzero(as_tuple=True)[0]
            if rows.numel() == 0:
                continue
            out = out.index_add(0, rows, expert(f"{f}experts.{e}.", xf[rows], w[rows, e]))
        out = out + expert(f + "shared_experts.", xf, torch.ones(xf.shape[0]))
        return out.reshape(shape)

    def _block(self, l: int, X: torch.Tensor, pre: torch.Tensor, first_position: int,
               window_start: Optional[torch.Tensor], state: dict, aux: Optional[list],
               stats: Optional[dict]) -> Tuple[torch.Tensor, torch.Tensor]:
        c = self.c
        p = f"layers.{l}."
        hc, it, eps = c.hc_mult, c.hc_sinkhorn_iters, c.hc_eps
        R = X
        a1, post, comb = hc_coefficients(hc_mixes(X, self.p(p + "hc_attn_fn")),
                                         self.p(p + "hc_attn_base"), self.p(p + "hc_attn_scale"),
                                         hc, it, eps)
        xin = rms_norm(hc_pre(X, pre), self.p(p + "attn_norm.weight"), c.rms_norm_eps)
        if l < c.num_hidden_layers:
            y = self._attention(l, xin, first_position, window_start, state, aux)
        else:
            y = self._draft_attention(l, xin, first_position, state)
        X = hc_post(y, R, post, comb)
        R = X
        a2, post, comb = hc_coefficients(hc_mixes(X, self.p(p + "hc_ffn_fn")),
                                         self.p(p + "hc_ffn_base"), self.p(p + "hc_ffn_scale"),
                                         hc, it, eps)
        xin = rms_norm(hc_pre(X, a1), self.p(p + "ffn_norm.weight"), c.rms_norm_eps)
        y = self._moe(l, xin, stats)
        return hc_post(y, R, post, comb), a2

    def _embed(self, tokens: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        c = self.c
        e = self.p("embed.weight")[tokens]
        X = e[:, :, None, :].expand(*e.shape[:2], c.hc_mult, c.hidden_size)
        pre = torch.zeros(*e.shape[:2], c.hc_mult)
        pre[..., 0] = 1.0
        return X, pre

    # ---- the trunk ----

    def forward(self, tokens: torch.Tensor, enc_start: Optional[torch.Tensor] = None,
                dec_start: Optional[torch.Tensor] = None, aux: Optional[list] = None,
                stats: Optional[dict] = None, want_hidden: bool = False):
        """Logits [B, N, V] of every position of tokens [B, N]. enc_start / dec_start [B]:
        where the encoder's / decoder's sliding windows start (None: at 0). With
        want_hidden, also the drafter's main hidden states [B, N, targets·D]."""
        c = self.c
        B, N = tokens.shape
        X, pre = self._embed(tokens)
        rows = {l: torch.from_numpy(engram_rows(c, s, tokens.numpy()))
                for s, l in enumerate(c.engram_layer_ids)}
        state: dict = {"entries": {}, "selected": {}, "pool": None}
        hidden = []
        for l in range(c.num_hidden_layers):
            if c.layers[l].has_engram:
                X = self._engram(l, X, rows[l])
            if c.layers[l].is_dspark_target:
                hidden.append(X.mean(2))
            start = enc_start if l < c.encoder_layers else dec_start
            X, pre = self._block(l, X, pre, 0, start, state, aux, stats)
        x = rms_norm(hc_pre(X, pre), self.p("norm.weight"), c.rms_norm_eps)
        logits = self._linear(x, "head.weight")
        if want_hidden:
            return logits, torch.cat(hidden, dim=-1)
        return logits

    # ---- DSpark ----

    def draft_ring(self, main_hidden: torch.Tensor, positions: torch.Tensor) -> List[torch.Tensor]:
        """Each draft layer's window rows [B, M, hd] for main hidden states [B, M, targets·D]
        at `positions` [M]."""
        c = self.c
        mx = rms_norm(self._linear(main_hidden, "dspark.main_proj.weight"),
                      self.p("dspark.main_norm.weight"), c.rms_norm_eps)
        out = []
        for l in range(c.num_hidden_layers, c.total_layers):
            a = f"layers.{l}.attn."
            cos, sin = rope_tables(self.freqs[l], positions)
            kv = rms_norm(self._linear(mx, a + "wkv.weight"), self.p(a + "kv_norm.weight"),
                          c.rms_norm_eps)
            out.append(fake_quant(apply_rope(kv, cos, sin), "swa"))
        return out

    def _draft_attention(self, l: int, x: torch.Tensor, first_position: int,
                         state: dict) -> torch.Tensor:
        """The draft block [B, S, D] at first_position…: it sees the ring (the main model's
        last window, state["ring"][l] [B, M, hd]) and itself, both ways."""
        c = self.c
        a = f"layers.{l}.attn."
        B, S, D = x.shape
        H, hd = c.num_attention_heads, c.head_dim
        cos, sin = rope_tables(self.freqs[l], torch.arange(S) + first_position)
        qr = rms_norm(self._linear(x, a + "wq_a.weight"), self.p(a + "q_norm.weight"),
                      c.rms_norm_eps)
        q = apply_rope(self._linear(qr, a + "wq_b.weight").reshape(B, S, H, hd),
                       cos[:, None, :], sin[:, None, :])
        kv = rms_norm(self._linear(x, a + "wkv.weight"), self.p(a + "kv_norm.weight"),
                      c.rms_norm_eps)
        kv = fake_quant(apply_rope(kv, cos, sin), "swa")
        keys = torch.cat([state["ring"][l - c.num_hidden_layers], kv], dim=1)
        sc = torch.einsum("bshd,bmd->bhsm", q, keys) / math.sqrt(hd)
        if "ring_mask" in state:
            sc = sc.masked_fill(~state["ring_mask"][:, None, None, :], NEG_INF)
        sink = self.p(a + "attn_sink").view(1, H, 1, 1).expand(B, H, S, 1)
        allsc = torch.cat([sc, sink], dim=-1)
        probs = torch.exp(allsc[..., :-1] - torch.logsumexp(allsc, -1, keepdim=True))
        o = torch.einsum("bhsm,bmd->bshd", probs, keys)
        return self._output(a, o, cos, sin)

    def draft_logits(self, ring: List[torch.Tensor], next_tokens: torch.Tensor,
                     first_position: int, ring_mask: Optional[torch.Tensor] = None,
                     stats: Optional[dict] = None) -> torch.Tensor:
        """The drafter's base logits [B, S, V] for blocks [next, noise…] at first_position
        (the Markov bias is added by the caller, token by token)."""
        c = self.c
        S = c.dspark_block_size
        B = next_tokens.shape[0]
        toks = torch.full((B, S), c.dspark_noise_token_id, dtype=torch.long)
        toks[:, 0] = next_tokens
        X, pre = self._embed(toks)
        state: dict = {"ring": ring}
        if ring_mask is not None:
            state["ring_mask"] = torch.cat([ring_mask, torch.ones(B, S, dtype=torch.bool)], 1)
        for l in range(c.num_hidden_layers, c.total_layers):
            X, pre = self._block(l, X, pre, first_position, None, state, None, stats)
        x = rms_norm(hc_pre(X, pre), self.p("dspark.norm.weight"), c.rms_norm_eps)
        return self._linear(x, "head.weight")

    def markov_bias(self, prev: torch.Tensor) -> torch.Tensor:
        return self.p("dspark.markov.embed")[prev] @ self.p("dspark.markov.head").t()
