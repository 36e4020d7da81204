"""Keeps chunk-sized buffers in the heap of a client process.

Every chunk a gRPC fetch delivers passes through buffers of a chunk's size or more (gRPC's
receive buffers, the message's bytes). glibc gives each allocation over 128 KiB its own
mmap and hands a freed heap top back to the kernel past 128 KiB, so each such buffer is
fresh memory, faulted in page by page on its first write: at ~11 µs a fault that is most
of a chunk's cost (a 32-chunk fetch from Python measured 120–580 µs of CPU a chunk, 72–81
with the heap kept). C++ programs do the same at start (base/heap.h, whose kClientHeap
holds the numbers below).

Raised once per process, when the first client is made: allocations up to 64 MiB come
from the heap, and up to 256 MiB of free heap top stays in the process. Left alone where
the process already chose (glibc's MALLOC_MMAP_THRESHOLD_ or MALLOC_TRIM_THRESHOLD_ set),
where the C library is not glibc, or with KVCACHE_TUNE_MALLOC=0."""
import ctypes
import os
import platform

_M_TRIM_THRESHOLD = -1  # glibc's malloc.h
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 64 << 20
TRIM_THRESHOLD = 256 << 20

_done = False


def keep_large_buffers() -> bool:
    """Sets the thresholds above (once); True when this call or an earlier one set them."""
    global _done
    if _done:
        return True
    if os.environ.get("KVCACHE_TUNE_MALLOC", "1") == "0":
        return False
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") or os.environ.get("MALLOC_TRIM_THRESHOLD_"):
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    # mallopt returns 1 on success; setting the mmap threshold also ends glibc's dynamic
    # adjustment of both thresholds, which is what lets the heap top go back each call.
    _done = (libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
             and libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1)
    return _done
