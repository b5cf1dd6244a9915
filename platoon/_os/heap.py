"""glibc's heap kept, rather than given back, in a process that receives a stream of messages.

ZeroMQ's I/O thread allocates every message it receives and the process frees it once read.
With glibc's defaults a stream of minibatches makes that thread's heap grow and shrink: the
free memory at its top goes back to the system (trimmed) past 128 KiB, and the next messages
touch fresh pages again. Measured (16 KiB minibatches, a worker's I/O thread): 2.1 page
faults and 15-16 us of CPU per message with the defaults, 0.03 and 10 us with the heap kept;
raw PUSH/PULL's 0.5-0.8 and 13-15 us. A trim threshold alone would make glibc map every
allocation over 128 KiB on its own (its threshold stops adapting): 257 faults per 1 MiB
minibatch. So both are set, to where glibc's own adaptive thresholds end at their largest.
"""

import ctypes
import os
from typing import List

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameters (glibc's malloc.h)
# glibc's adaptive mmap threshold grows to at most 32 MiB on 64-bit (4 MiB x sizeof(long)),
# the trim threshold to twice it
MMAP_THRESHOLD = 4 * 1024 * 1024 * ctypes.sizeof(ctypes.c_long)
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD
# a user's own choice, which is left as it is
USER_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_")

_kept: List[bool] = []  # [True] once this process's heap is kept


def keep_heap() -> bool:
    """Keep this process's heap (up to TRIM_THRESHOLD of free memory at its top, and
    allocations under MMAP_THRESHOLD in it) rather than give it back after each burst of
    messages; once a process. Whether it is kept: not where the C library has no glibc
    `mallopt`, nor where the user set glibc's malloc settings (USER_SETTINGS, or
    ``glibc.malloc`` tunables in GLIBC_TUNABLES), which are left as they are."""
    if _kept:
        return True
    if any(name in os.environ for name in USER_SETTINGS) \
            or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own C library
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to do
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    if mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD):
        _kept.append(True)
    return bool(_kept)
