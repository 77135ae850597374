"""Keep freed memory for reuse in the ``geodbk`` process (glibc's allocator settings).

glibc serves an allocation above its mmap threshold (128 KB at start, raised on the fly up to
32 MB) with fresh pages from the kernel and gives them back when it is freed, and trims the
heap whenever more than twice that threshold is free at its top. A model pass allocates and
frees tensors of megabytes for every chunk of rows, so each chunk faults its pages in again:
about half a million page faults for a map of 10^6 cells. :func:`keep_freed_memory` fixes the
mmap threshold at :data:`MMAP_THRESHOLD` and the trim threshold at :data:`TRIM_THRESHOLD`, so
that freed blocks are reused; the figures are in ``docs/benchmarks.md`` (the predict phases).
It is what PyTorch's CPU tuning guide gets from swapping in jemalloc or tcmalloc, without a
second allocator. Other C libraries are left alone.
"""

from __future__ import annotations

import ctypes
import os
import platform

#: Allocations of this many bytes or more still get their own pages (and return them).
MMAP_THRESHOLD = 64 << 20
#: Free memory at the heap's top beyond this many bytes is given back to the kernel.
TRIM_THRESHOLD = 256 << 20
#: Set this environment variable to 1 to keep glibc's own settings.
OPT_OUT = "GEODBK_DEFAULT_MALLOC"

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def keep_freed_memory() -> bool:
    """Set glibc's mmap and trim thresholds (``mallopt``) for this process; returns whether
    they were set (not on another C library, nor with ``GEODBK_DEFAULT_MALLOC=1``)."""
    if os.environ.get(OPT_OUT, "") not in ("", "0") or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
