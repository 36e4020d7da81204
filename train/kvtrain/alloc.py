"""The process's allocator, told to keep freed memory (python3 -m kvtrain.train calls
`keep_freed_memory` first).

A training step allocates and frees thousands of tensors of 0.1–32 MB. glibc's malloc
serves blocks above its mmap threshold (128 KB at start, moved up only as large blocks are
freed) with fresh mmap'd pages and returns freed heap tops to the kernel, so the same
megabytes are faulted in again on every step; on a virtual machine a page fault costs
microseconds, and a step spent over half its time in them (docs/quality.md, "Training
throughput, the allocator"). Serving every block from the heap (no mmap) and raising the
trim threshold out of reach keeps the freed blocks for the next step's tensors.
"""
from __future__ import annotations

import ctypes
import ctypes.util

# mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_MAX = -4

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
    # No mmap at all, every block from the heap: raising the mmap threshold would not do,
    # glibc caps it at 32 MB and a [2, 1024, 4, 1024] score tensor is 32 MB.
    ok = mallopt(M_MMAP_MAX, 0) == 1
    ok = mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and ok
    return mallopt(M_TOP_PAD, TOP_PAD) == 1 and ok
