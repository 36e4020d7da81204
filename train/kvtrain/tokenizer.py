"""Byte-level tokens inside a V4.1 config's vocabulary: ids 0, 1, 2 are the config's bos,
eos and pad; byte b is id 3 + b. Nothing to download, and every text has a tokenization."""
from __future__ import annotations

from typing import Iterable, List

BOS, EOS, PAD = 0, 1, 2
BYTE0 = 3
BYTE_TOKENS = 256


def check_vocab(vocab_size: int, noise_token: int = -1) -> None:
    if vocab_size < BYTE0 + BYTE_TOKENS:
        raise ValueError(f"vocab_size is {vocab_size}; byte tokens need {BYTE0 + BYTE_TOKENS}")
    if BYTE0 <= noise_token < BYTE0 + BYTE_TOKENS:
        raise ValueError(f"dspark_noise_token_id {noise_token} is a byte token")


def encode(text: str | bytes) -> List[int]:
    data = text.encode("utf-8") if isinstance(text, str) else text
    return [BYTE0 + b for b in data]


def decode(ids: Iterable[int]) -> str:
    out = bytearray()
    for t in ids:
        if BYTE0 <= t < BYTE0 + BYTE_TOKENS:
            out.append(t - BYTE0)
    return out.decode("utf-8", errors="replace")
