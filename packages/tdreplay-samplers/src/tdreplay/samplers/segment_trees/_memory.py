"""Host arrays for the large per-slot state of the prioritized sampler (trees, generations).

:func:`host_array` returns a numpy array that starts on a cache line, and, when it spans at
least a 2 MiB huge page, on a 2 MiB boundary of an anonymous mapping advised with
``MADV_HUGEPAGE``: the transparent huge pages then cover it whole, so reads of random slots
(a tree descent, a generation lookup) miss the TLB far less. numpy advises only allocations of
4 MiB or more, from wherever malloc puts them; torch does not advise at all. Where the OS has no
``MADV_HUGEPAGE`` (or refuses it), the array is plain memory.
"""

from __future__ import annotations

import mmap
from typing import Any

import numpy as np

__all__ = ["CACHE_LINE", "HUGE_PAGE", "host_array"]

#: Alignment of every array: one block of 8 float64 children per cache line.
CACHE_LINE = 64
#: Arrays at least this large start on a 2 MiB boundary and are advised as huge pages.
HUGE_PAGE = 2 << 20


def host_array(size: int, dtype: Any, fill: Any = 0) -> np.ndarray:
    """A 1-d array of ``size`` items of ``dtype``, all ``fill``, aligned as the module says.

    Examples
    --------
    >>> small = host_array(10, np.float64, 1.5)
    >>> small.ctypes.data % CACHE_LINE, small.tolist() == [1.5] * 10
    (0, True)
    >>> large = host_array(HUGE_PAGE // 4, np.int32)
    >>> large.ctypes.data % HUGE_PAGE, int(large.max()), large.flags.writeable
    (0, 0, True)
    """
    dtype = np.dtype(dtype)
    nbytes = size * dtype.itemsize
    if nbytes >= HUGE_PAGE and hasattr(mmap, "MADV_HUGEPAGE"):
        # private (as malloc's: a forked child gets a copy, and shared memory would not get
        # transparent huge pages); the unused head and tail are address space only
        # the advice covers whole huge pages, the last one too (at most 2 MiB more resident)
        advised = -(-nbytes // HUGE_PAGE) * HUGE_PAGE
        region = mmap.mmap(-1, advised + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        raw = np.frombuffer(region, dtype=np.uint8)  # keeps the mapping alive
        start = -raw.ctypes.data % HUGE_PAGE
        try:
            region.madvise(mmap.MADV_HUGEPAGE, start, advised)
        except OSError:  # e.g. transparent huge pages compiled out: plain pages
            pass
        arr = raw[start : start + nbytes].view(dtype)
        if fill != 0:  # a new anonymous mapping reads as zeros
            arr.fill(fill)
        return arr
    raw = np.empty(nbytes + CACHE_LINE, dtype=np.uint8)
    start = -raw.ctypes.data % CACHE_LINE
    arr = raw[start : start + nbytes].view(dtype)
    arr.fill(fill)
    return arr
