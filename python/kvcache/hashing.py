"""The public prefix-key scheme (docs/prefix-hashing.md), computed locally.

    key_0 = root
    key_i = XXH3-128(key_{i-1} ‖ the chunk's token ids as little-endian u32)

Only whole chunks get keys.
"""
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import xxhash

from .errors import InvalidArgumentError


@dataclass(frozen=True)
class Namespace:
    """A registered namespace: what chunk keys and payload sizes derive from."""
    id: int
    root_key: bytes
    chunk_bytes: int
    chunk_tokens: int
    kv_layout_version: int
    vocab_size: Optional[int] = None  # from the model config, when the client registered it


# Token ids: a sequence of ints or an integer numpy array.
Tokens = Any


def as_tokens(tokens, vocab_size=None):
    """tokens (a sequence or array of ints) as a 1-D little-endian uint32 array, or
    InvalidArgumentError naming the first bad id."""
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        raise InvalidArgumentError(f"tokens must be one-dimensional, not of shape {arr.shape}")
    if arr.size == 0:
        return np.zeros(0, dtype="<u4")
    if not np.issubdtype(arr.dtype, np.integer):
        raise InvalidArgumentError(f"tokens must be integers, not {arr.dtype}")
    limit = 2**32 if vocab_size is None else vocab_size
    bad = np.flatnonzero((arr < 0) | (arr >= limit))
    if bad.size:
        i = int(bad[0])
        where = "outside uint32" if vocab_size is None else f"outside the vocabulary of {vocab_size}"
        raise InvalidArgumentError(f"tokens[{i}] is {int(arr[i])}, {where}")
    return arr.astype("<u4", copy=False)


def chunk_keys(root_key, tokens, chunk_tokens):
    """The keys of every whole chunk of `tokens` under `root_key` (16 bytes each)."""
    if len(root_key) != 16:
        raise InvalidArgumentError(f"root key is {len(root_key)} bytes; keys are 16 bytes")
    if chunk_tokens <= 0:
        raise InvalidArgumentError(f"chunk_tokens is {chunk_tokens}")
    arr = as_tokens(tokens)
    keys, prev = [], bytes(root_key)
    for at in range(0, arr.size - chunk_tokens + 1, chunk_tokens):
        prev = xxhash.xxh3_128_digest(prev + arr[at:at + chunk_tokens].tobytes())
        keys.append(prev)
    return keys
