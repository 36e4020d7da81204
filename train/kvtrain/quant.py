"""The KV number formats as fake quantization in torch (the engine's engine/spec/
kv_codec.h; the reference's act_quant / fp4_act_quant), with straight-through gradients:
the forward pass gives exactly the dequantized values the engine's pages hold, the
backward pass treats the rounding as identity.

  swa   (window KV): E4M3 values, one power-of-two (E8M0) scale per 32
  main  (compressed KV): E2M1 values, one E4M3 scale per 16
  index (index keys and queries): E2M1 values, one power-of-two scale per 32
"""
from __future__ import annotations

import torch

E4M3_MAX = 448.0
E2M1_MAX = 6.0


def _round_e4m3(v: torch.Tensor) -> torch.Tensor:
    """Round to the nearest E4M3 value (ties to even), saturating at ±448."""
    a = v.abs().clamp(max=E4M3_MAX)
    # Normal numbers have 3 mantissa bits; below 2^-6 the step is 2^-9 (subnormals).
    e = torch.floor(torch.log2(a.clamp(min=2.0 ** -6)))
    step = torch.exp2(e - 3)
    q = torch.round(a / step) * step
    return torch.copysign(q.clamp(max=E4M3_MAX), v)


def _round_e2m1(v: torch.Tensor) -> torch.Tensor:
    """Round to the nearest E2M1 value {0, .5, 1, 1.5, 2, 3, 4, 6} (ties to even)."""
    a = v.abs().clamp(max=E2M1_MAX)
    step = torch.where(a < 2.0, torch.full_like(a, 0.5),
                       torch.where(a < 4.0, torch.full_like(a, 1.0), torch.full_like(a, 2.0)))
    q = torch.round(a / step) * step
    return torch.copysign(q.clamp(max=E2M1_MAX), v)


def _pow2_ceil(y: torch.Tensor) -> torch.Tensor:
    """2^ceil(log2 y), exactly (frexp, not a float log)."""
    m, e = torch.frexp(y)
    # y = m * 2^e with m in [0.5, 1): a power of two has m = 0.5.
    e = torch.where(m == 0.5, e - 1, e)
    return torch.ldexp(torch.ones_like(y), e)


def _quant(x: torch.Tensor, fmt: str) -> torch.Tensor:
    shape = x.shape
    block = 16 if fmt == "main" else 32
    xb = x.reshape(*shape[:-1], shape[-1] // block, block).float()
    amax = xb.abs().amax(dim=-1, keepdim=True)
    if fmt == "main":
        s = _round_e4m3(torch.clamp(amax, min=6.0 * 2.0 ** -9) / E2M1_MAX)
        y = _round_e2m1(torch.clamp(xb / s, -E2M1_MAX, E2M1_MAX)) * s
    elif fmt == "index":
        s = _pow2_ceil(torch.clamp(amax, min=6.0 * 2.0 ** -126) / E2M1_MAX)
        y = _round_e2m1(torch.clamp(xb / s, -E2M1_MAX, E2M1_MAX)) * s
    elif fmt == "swa":
        s = _pow2_ceil(torch.clamp(amax, min=1e-4) / E4M3_MAX)
        y = _round_e4m3(torch.clamp(xb / s, -E4M3_MAX, E4M3_MAX)) * s
    else:
        raise ValueError(f"unknown KV format {fmt!r} (main, index or swa)")
    return y.reshape(shape).to(x.dtype)


class _FakeQuant(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, fmt):
        return _quant(x, fmt)

    @staticmethod
    def backward(ctx, g):
        return g, None


def fake_quant(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """x rounded through format `fmt` along its last dimension (straight-through grad)."""
    return _FakeQuant.apply(x, fmt)
