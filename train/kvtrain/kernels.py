"""The fused CPU kernels of kernels.c, compiled on first use and called through ctypes, as
autograd functions: Sinkhorn, hc_post and the top-k attention's selected-row products.

Compiled with the system C compiler (`cc`, -O3 -march=native) into a cache folder
($KVTRAIN_KERNEL_DIR, else ~/.cache/kvtrain) under a name that hashes the source, the flags
and the CPU, so a change to any of them compiles afresh; two processes compiling at once
each write their own file and rename it into place. Set KVTRAIN_KERNELS=0 to run the
PyTorch forms instead (model.py's reference; bench/train/step_bench.py's `torch-ops`
variant). Without a compiler the PyTorch forms run, after one line on stderr."""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import platform
import subprocess
import sys
import tempfile
from typing import Iterator, Optional

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "kernels.c")
FLAGS = ["-O3", "-march=native", "-fopenmp-simd", "-fPIC", "-shared", "-std=c11"]

_lib: Optional[ctypes.CDLL] = None
_tried = False


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return "".join(l for l in f if l.startswith(("model name", "flags")))[:4096]
    except OSError:
        return platform.processor()


def _build() -> Optional[ctypes.CDLL]:
    with open(SOURCE, "rb") as f:
        src = f.read()
    key = hashlib.sha256(src + " ".join(FLAGS).encode() + _cpu().encode()).hexdigest()[:16]
    folder = os.environ.get("KVTRAIN_KERNEL_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "kvtrain")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"kernels-{key}.so")
    if not os.path.exists(path):
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=folder)
        os.close(fd)
        r = subprocess.run(["cc", *FLAGS, SOURCE, "-o", tmp, "-lm"], capture_output=True, text=True)
        if r.returncode != 0:
            os.unlink(tmp)
            raise OSError(f"cc failed on {SOURCE}:\n{r.stderr[-2000:]}")
        os.replace(tmp, path)
    lib = ctypes.CDLL(path)
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    for s, real in (("f32", ctypes.c_float), ("f64", ctypes.c_double)):
        getattr(lib, f"kvt_sinkhorn_fwd_{s}").argtypes = [p, p, i64, i32, i32, real]
        getattr(lib, f"kvt_sinkhorn_bwd_{s}").argtypes = [p, p, p, i64, i32, i32, real]
        getattr(lib, f"kvt_hc_post_fwd_{s}").argtypes = [p, p, p, p, p, i64, i32, i64]
        getattr(lib, f"kvt_hc_post_bwd_{s}").argtypes = [p] * 9 + [i64, i32, i64]
        getattr(lib, f"kvt_hc_post_fwd_{s}").restype = None
        getattr(lib, f"kvt_hc_post_bwd_{s}").restype = None
        getattr(lib, f"kvt_selected_fwd_{s}").argtypes = [p] * 4 + [i64] * 6 + [i32]
        getattr(lib, f"kvt_selected_bwd_{s}").argtypes = [p] * 6 + [i64] * 6 + [i32]
    return lib


def lib() -> Optional[ctypes.CDLL]:
    """The compiled kernels, or None (KVTRAIN_KERNELS=0, or no compiler)."""
    global _lib, _tried
    if not _tried:
        _tried = True
        if os.environ.get("KVTRAIN_KERNELS", "1") != "0":
            try:
                _lib = _build()
            except OSError as e:
                print(f"kvtrain: fused kernels unavailable, PyTorch forms instead ({e})",
                      file=sys.stderr)
    return _lib


_off = 0  # torch_forms() blocks open


@contextlib.contextmanager
def torch_forms() -> Iterator[None]:
    """Within the block model.py runs its PyTorch forms (the references) instead."""
    global _off
    _off += 1
    try:
        yield
    finally:
        _off -= 1


def usable(*tensors: torch.Tensor) -> bool:
    """The kernels take float32 or float64 CPU tensors, all of one type."""
    t = tensors[0]
    return (not _off and lib() is not None and t.dtype in (torch.float32, torch.float64) and
            all(x.device.type == "cpu" and x.dtype == t.dtype for x in tensors))


def _fn(name: str, t: torch.Tensor):
    return getattr(lib(), f"kvt_{name}_{'f32' if t.dtype == torch.float32 else 'f64'}")


def _real(t: torch.Tensor, v: float):
    return (ctypes.c_float if t.dtype == torch.float32 else ctypes.c_double)(v)


def _check_sinkhorn(rc: int, hc: int) -> None:
    if rc == -2:
        raise MemoryError("sinkhorn: no memory for the backward's per-token trace")
    if rc != 0:
        raise ValueError(f"sinkhorn: hc is {hc}; the kernel takes 1 to 8")


def _check_selected(rc: int, idx: torch.Tensor, Nc: int) -> None:
    if rc != 0:
        raise ValueError(f"selected rows: indices run {int(idx.min())}..{int(idx.max())}, "
                         f"outside the {Nc} rows of main")


class Sinkhorn(torch.autograd.Function):
    """model.sinkhorn_reference for logits [.., hc, hc]; the backward recomputes the
    forward per token instead of keeping its 40 steps."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, iters: int, eps: float) -> torch.Tensor:  # type: ignore[override]
        z = logits.contiguous()
        hc = z.shape[-1]
        out = torch.empty_like(z)
        _check_sinkhorn(_fn("sinkhorn_fwd", z)(z.data_ptr(), out.data_ptr(),
                                               z.numel() // (hc * hc), hc, iters, _real(z, eps)),
                        hc)
        ctx.save_for_backward(z)
        ctx.iters, ctx.eps = iters, eps
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        (z,) = ctx.saved_tensors
        hc = z.shape[-1]
        g = grad.contiguous().to(z.dtype)
        dz = torch.empty_like(z)
        _check_sinkhorn(_fn("sinkhorn_bwd", z)(z.data_ptr(), g.data_ptr(), dz.data_ptr(),
                                               z.numel() // (hc * hc), hc, ctx.iters,
                                               _real(z, ctx.eps)), hc)
        return dz, None, None


class HcPost(torch.autograd.Function):
    """out[.., k, :] = post[.., k] f + Σ_j comb[.., j, k] R[.., j, :] for f [.., D],
    R [.., hc, D], post [.., hc], comb [.., hc, hc] (model.hc_post)."""

    @staticmethod
    def forward(ctx, f, R, post, comb):
        f, R, post, comb = (t.contiguous() for t in (f, R, post, comb))
        hc, D = R.shape[-2], R.shape[-1]
        out = torch.empty_like(R)
        _fn("hc_post_fwd", R)(f.data_ptr(), R.data_ptr(), post.data_ptr(), comb.data_ptr(),
                              out.data_ptr(), R.numel() // (hc * D), hc, D)
        ctx.save_for_backward(f, R, post, comb)
        return out

    @staticmethod
    def backward(ctx, grad):
        f, R, post, comb = ctx.saved_tensors
        hc, D = R.shape[-2], R.shape[-1]
        g = grad.contiguous().to(R.dtype)
        df, dR, dpost, dcomb = (torch.empty_like(t) for t in (f, R, post, comb))
        _fn("hc_post_bwd", R)(f.data_ptr(), R.data_ptr(), post.data_ptr(), comb.data_ptr(),
                              g.data_ptr(), df.data_ptr(), dR.data_ptr(), dpost.data_ptr(),
                              dcomb.data_ptr(), R.numel() // (hc * D), hc, D)
        return df, dR, dpost, dcomb


class SelectedRows(torch.autograd.Function):
    """model._SelectedRows without the gathered copy: rows [B, N, H, X] against the k rows
    of main [B, Nc, hd] each query selected (idx [B, N, k]); keys → [B, N, H, k], values →
    [B, N, H, hd]."""

    @staticmethod
    def forward(ctx, rows, main, idx, keys: bool):  # type: ignore[override]
        rows, main = rows.contiguous(), main.contiguous()
        idx = idx.contiguous().to(torch.int64)
        B, Nc, hd = main.shape
        N, H, k = idx.shape[1], rows.shape[2], idx.shape[2]
        out = rows.new_empty((B, N, H, k if keys else hd))
        _check_selected(_fn("selected_fwd", rows)(rows.data_ptr(), main.data_ptr(),
                                                  idx.data_ptr(), out.data_ptr(), B, N, H, k, Nc,
                                                  hd, int(keys)), idx, Nc)
        ctx.save_for_backward(rows, main, idx)
        ctx.keys = keys
        return out

    @staticmethod
    def backward(ctx, grad):
        rows, main, idx = ctx.saved_tensors
        B, Nc, hd = main.shape
        N, H, k = idx.shape[1], rows.shape[2], idx.shape[2]
        g = grad.contiguous().to(rows.dtype)
        grad_rows = torch.empty_like(rows)
        grad_main = torch.zeros_like(main)
        _check_selected(_fn("selected_bwd", rows)(rows.data_ptr(), main.data_ptr(),
                                                  idx.data_ptr(), g.data_ptr(),
                                                  grad_rows.data_ptr(), grad_main.data_ptr(),
                                                  B, N, H, k, Nc, hd, int(ctx.keys)), idx, Nc)
        return grad_rows, grad_main, None, None
