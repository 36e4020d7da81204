"""The process's allocator, told to keep freed memory (python3 -m kvtrain.train calls
`keep_freed_memory` first).

A training step allocates and frees thousands of tensors of 0.1–32 MB. glibc's malloc
serves blocks above its mmap threshold (128 KB at start, moved up only as large blocks are
freed) with fresh mmap'd pages and returns freed heap tops to the kernel, so the same
megabytes are faulted in again on every step; on a virtual machine a page fault costs
microseconds, and a step spent over half its time in them (docs/quality.md, "Training
throughput"). Serving every block from the heap (no mmap) and raising the trim threshold
out of reach keeps the freed blocks for the next step's tensors of the same sizes.
"""
from __future__ import annotations

import ctypes
import ctypes.util

# mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3
M_MMAP_MAX = -4

MMAP_THRESHOLD = 32 << 20  # glibc's largest (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit)
TRIM_THRESHOLD = 2**31 - 1  # (mallopt takes an int) never hand the heap's top back
TOP_PAD = 256 << 20        # grow the heap in 256 MB steps


def keep_freed_memory() -> bool:
    """True when glibc took the settings; False (and nothing changed) on another libc."""
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    # Blocks of 32 MB and more (a [2, 1024, 4, 1024] score tensor) would still be mmap'd
    # whatever the threshold: no mmap at all, every block from the heap.
    ok = mallopt(M_MMAP_MAX, 0) == 1 and ok
    ok = mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and ok
    return mallopt(M_TOP_PAD, TOP_PAD) == 1 and ok
