"""The public prefix-key scheme (docs/prefix-hashing.md), computed locally.

    key_0 = root
    key_i = XXH3-128(key_{i-1} ‖ the chunk's token ids as little-endian u32)

Only whole chunks get keys. A caller-keyed namespace (a serving engine's page hashes as
keys) maps each caller key instead:

    chunk key = XXH3-128("kvcache-caller-key-v1" ‖ root ‖ u32 length ‖ the caller key)
"""
import contextlib
import ctypes
import os
import struct
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, List, Optional, Union

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
    # Registered with register_keyed_namespace: keys are the caller's (caller_keys maps
    # them), chunk_bytes the caller's page size; stores go through store_keys.
    caller_keys: bool = False


MAX_CALLER_KEY_BYTES = 64


def caller_key_bytes(key: Union[str, bytes, bytearray, memoryview], what: str = "key") -> bytes:
    """A caller's key as bytes (a str as UTF-8); InvalidArgumentError naming `what` unless
    it is 1..64 bytes."""
    if isinstance(key, str):
        b = key.encode("utf-8")
    elif isinstance(key, (bytes, bytearray, memoryview)):
        b = bytes(key)
    else:
        raise InvalidArgumentError(f"{what} is a {type(key).__name__}; caller keys are str or bytes")
    if not 0 < len(b) <= MAX_CALLER_KEY_BYTES:
        raise InvalidArgumentError(
            f"{what} is {len(b)} bytes; caller keys are 1 to {MAX_CALLER_KEY_BYTES} bytes")
    return b


def caller_namespace_root(tenant: str, model_id: str, page_bytes: int, page_tokens: int) -> bytes:
    """The root of a caller-keyed namespace (the daemon computes it; for checking)."""
    t, m = tenant.encode("utf-8"), model_id.encode("utf-8")
    return xxhash.xxh3_128_digest(
        b"kvcache-caller-ns-v1" + struct.pack("<I", len(t)) + t + struct.pack("<I", len(m)) + m +
        struct.pack("<QI", page_bytes, page_tokens))


def caller_chunk_keys(root_key: bytes, keys: Iterable[Union[str, bytes]]) -> List[bytes]:
    """The 16-byte chunk key of each caller key (str or bytes, 1..64 bytes) under root_key."""
    prefix = b"kvcache-caller-key-v1" + bytes(root_key)
    out: List[bytes] = []
    for i, k in enumerate(keys):
        b = caller_key_bytes(k, f"keys[{i}]")
        out.append(xxhash.xxh3_128_digest(prefix + struct.pack("<I", len(b)) + b))
    return out


# Token ids: a sequence of ints or an integer numpy array.
Tokens = Any


def as_tokens(tokens: Tokens, vocab_size: Optional[int] = None) -> Any:
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
    # One reduction per bound (no temporary arrays); the index only when one fails. A
    # uint32 array needs no check against uint32 (1M tokens: ~0.3 ms instead of ~2 ms).
    unsigned = np.issubdtype(arr.dtype, np.unsignedinteger)
    too_low = not unsigned and int(arr.min()) < 0
    too_high = not (vocab_size is None and arr.dtype.itemsize <= 4 and unsigned) and \
        int(arr.max()) >= limit
    if too_low or too_high:
        i = int(np.flatnonzero((arr < 0) | (arr >= limit))[0])
        where = "outside uint32" if vocab_size is None else f"outside the vocabulary of {vocab_size}"
        raise InvalidArgumentError(f"tokens[{i}] is {int(arr[i])}, {where}")
    return arr.astype("<u4", copy=False)


def _load_native() -> Optional[Callable[..., int]]:
    """kvc_chunk_keys from libkvcache_hash.so beside this file (client/prefix_hash_c.cc, built
    with the C++ tree), or None: then chunk_keys hashes chunk by chunk in Python (same keys).
    KVCACHE_NATIVE_HASH=0 turns the library off; KVCACHE_NATIVE_LIB names another path."""
    if os.environ.get("KVCACHE_NATIVE_HASH", "1") == "0":
        return None
    path = os.environ.get("KVCACHE_NATIVE_LIB") or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "libkvcache_hash.so")
    try:
        fn = ctypes.CDLL(path).kvc_chunk_keys
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_uint64
    fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32,
                   ctypes.c_void_p]
    return fn


_NATIVE_CHUNK_KEYS = _load_native()


def native_hashing() -> bool:
    """Whether chunk_keys hashes a prefix in one native call (libkvcache_hash.so)."""
    return _NATIVE_CHUNK_KEYS is not None


@contextlib.contextmanager
def python_hashing() -> Iterator[None]:
    """Within it, chunk_keys hashes one Python call per chunk, as without the native
    library: for a benchmark to set the two side by side in one process (not thread-safe)."""
    global _NATIVE_CHUNK_KEYS
    saved, _NATIVE_CHUNK_KEYS = _NATIVE_CHUNK_KEYS, None
    try:
        yield
    finally:
        _NATIVE_CHUNK_KEYS = saved


def chunk_keys(root_key: bytes, tokens: Tokens, chunk_tokens: int) -> List[bytes]:
    """The keys of every whole chunk of `tokens` under `root_key` (16 bytes each)."""
    if len(root_key) != 16:
        raise InvalidArgumentError(f"root key is {len(root_key)} bytes; keys are 16 bytes")
    if chunk_tokens <= 0:
        raise InvalidArgumentError(f"chunk_tokens is {chunk_tokens}")
    arr = as_tokens(tokens)
    if _NATIVE_CHUNK_KEYS is not None:
        arr = np.ascontiguousarray(arr)
        n = arr.size // chunk_tokens
        out = ctypes.create_string_buffer(16 * n)
        got = _NATIVE_CHUNK_KEYS(bytes(root_key), arr.ctypes.data, arr.size, chunk_tokens, out)
        raw = out.raw
        return [raw[i:i + 16] for i in range(0, 16 * got, 16)]
    return chunk_keys_python(root_key, arr, chunk_tokens)


def chunk_keys_python(root_key: bytes, arr: Any, chunk_tokens: int) -> List[bytes]:
    """chunk_keys one Python call per chunk: without the native library, and its reference."""
    step = 4 * chunk_tokens
    whole = (arr.size // chunk_tokens) * step
    # One copy of the whole chunks' bytes, then a view per chunk: per chunk only the hash
    # and one concatenation (40 % less time than a tobytes() per chunk, measured).
    raw = memoryview(arr[:whole // 4].tobytes())
    digest = xxhash.xxh3_128_digest
    keys: List[bytes] = []
    prev = bytes(root_key)
    for at in range(0, whole, step):
        prev = digest(prev + raw[at:at + step])
        keys.append(prev)
    return keys
