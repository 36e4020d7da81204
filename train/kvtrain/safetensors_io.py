"""The safetensors container the engine reads (engine/model/safetensors.h): an 8-byte
little-endian header length, a JSON header of {name: {dtype, shape, data_offsets}}, then
the tensors' bytes. Only F32 (and BF16 on read) — what the engine loads."""
from __future__ import annotations

import json
import struct
from typing import Dict, Optional

import numpy as np
import torch


def read(path: str) -> Dict[str, torch.Tensor]:
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        a, b = meta["data_offsets"]
        raw = data[base + a:base + b]
        if meta["dtype"] == "F32":
            arr = np.frombuffer(raw, dtype="<f4").copy()
        elif meta["dtype"] == "BF16":
            arr = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise ValueError(f"{path}: tensor {name} is {meta['dtype']}; only F32 and BF16")
        out[name] = torch.from_numpy(arr.reshape(meta["shape"]))
    return out


def metadata(path: str) -> Dict[str, str]:
    """The file's __metadata__ (empty when it has none)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return dict(header.get("__metadata__", {}))


def write(path: str, tensors: Dict[str, torch.Tensor],
          metadata: Optional[Dict[str, str]] = None) -> None:
    header: dict = {}
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    blobs = []
    at = 0
    for name, t in tensors.items():
        arr = t.detach().to(torch.float32).contiguous().cpu().numpy().astype("<f4")
        b = arr.tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
