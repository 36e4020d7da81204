#!/usr/bin/env python3
"""Independent NumPy implementation of the kvcache KV codecs, used to write the golden
vectors in tests/engine/spec/golden/ that the C++ tests check byte for byte.

It follows the reference implementation's quantize-dequantize in float32, but finds each
code by brute force (nearest representable value, ties to the even code) instead of the
C++ code's thresholds and bit tricks, so the two implementations share no logic.

  python3 scripts/kv_codec_reference.py --out tests/engine/spec/golden [--seed N]

Writes, per format (main, index, swa): <fmt>_input.f32 (rows x dim float32),
<fmt>_packed.bin (all codes, then all scales) and <fmt>_dequant.f32.
"""
import argparse
import math
import pathlib

import numpy as np

F32 = np.float32
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def e4m3_value(code):
    e, m = (code >> 3) & 0xF, code & 7
    v = m * 2.0**-9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
    return -v if code & 0x80 else v


E4M3_POS = [(c, e4m3_value(c)) for c in range(0x7F)]  # 0x7F is NaN


def nearest(a, table):
    """Index of the value nearest a (float64 distances are exact here); ties -> even."""
    best, best_d = None, None
    for code, v in table:
        d = abs(a - v)
        if best is None or d < best_d or (d == best_d and code % 2 == 0):
            best, best_d = code, d
    return best


def encode_e2m1(x):
    a = min(abs(float(x)), 6.0)
    code = nearest(a, list(enumerate(E2M1)))
    return code | (8 if math.copysign(1.0, float(x)) < 0 else 0)


def encode_e4m3(x):
    a = min(abs(float(x)), 448.0)
    code = nearest(a, E4M3_POS)
    return code | (0x80 if math.copysign(1.0, float(x)) < 0 else 0)


def e8m0_ceil(y):
    e = math.ceil(math.log2(float(y)))
    return e + 127


FORMATS = {
    # name: (block, fp4?, dim)
    "main": (16, True, 512),
    "index": (32, True, 128),
    "swa": (32, False, 512),
}


def quantize(fmt, x):
    block, fp4, _ = FORMATS[fmt]
    x = x.astype(F32).reshape(-1)
    codes, scales, deq = [], [], np.zeros_like(x)
    for b in range(0, x.size, block):
        xb = x[b:b + block]
        amax = F32(np.max(np.abs(xb)))
        if fmt == "main":
            y = F32(np.maximum(amax, F32(6 * 2.0**-9)) / F32(6))
            sc = encode_e4m3(y)
            s = F32(e4m3_value(sc))
        elif fmt == "index":
            y = F32(np.maximum(amax, F32(6 * 2.0**-126)) / F32(6))
            sc = e8m0_ceil(y)
            s = F32(2.0 ** (sc - 127))
        else:
            y = F32(np.maximum(amax, F32(1e-4)) / F32(448))
            sc = e8m0_ceil(y)
            s = F32(2.0 ** (sc - 127))
        scales.append(sc)
        q = (xb / s).astype(F32)
        for i, v in enumerate(q):
            if fp4:
                c = encode_e2m1(np.clip(v, -6, 6))
                val = math.copysign(E2M1[c & 7], -1.0 if c & 8 else 1.0)
            else:
                c = encode_e4m3(np.clip(v, -448, 448))
                val = e4m3_value(c)
            codes.append(c)
            deq[b + i] = F32(val) * s
    if fp4:
        packed = bytes(codes[i] | (codes[i + 1] << 4) for i in range(0, len(codes), 2))
    else:
        packed = bytes(codes)
    return packed + bytes(scales), deq


def make_rows(fmt, rng):
    dim = FORMATS[fmt][2]
    rows = [rng.standard_normal(dim) * 10.0 ** rng.uniform(-3, 1.5, size=dim // 16).repeat(16)
            for _ in range(3)]
    edge = np.zeros(dim)
    # Ties in scaled units (with amax 6 and scale 1 for main) and special values.
    edge[:16] = [6, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -0.25, -0.75, -5, -6, 0.1, -0.0, 4, 3]
    edge[16:32] = 0.0                                    # an all-zero block
    edge[32:48] = rng.standard_normal(16) * 1e-6         # tiny
    edge[48:64] = rng.standard_normal(16) * 1e3          # huge (beyond the E4M3 scale range / 6)
    edge[64:96] = -0.0                                   # negative zeros
    edge[96:] = rng.standard_normal(dim - 96) * 2.0 ** rng.integers(-20, 8)
    rows.append(edge)
    return np.stack(rows).astype(F32)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=20261130)
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    for fmt in FORMATS:
        x = make_rows(fmt, rng)
        packed, deq = quantize(fmt, x)
        (out / f"{fmt}_input.f32").write_bytes(x.astype("<f4").tobytes())
        (out / f"{fmt}_packed.bin").write_bytes(packed)
        (out / f"{fmt}_dequant.f32").write_bytes(deq.astype("<f4").tobytes())
        print(f"{fmt}: {x.shape[0]} rows x {x.shape[1]}, {len(packed)} packed bytes")


if __name__ == "__main__":
    main()
