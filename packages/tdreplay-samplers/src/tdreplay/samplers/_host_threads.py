"""Large host kernel calls split over threads: as many as torch's intra-op threads.

The numba kernels release the GIL (``nogil=True``), so a call over many independent items (the
draws of a prioritized sample, the updates of disjoint subtrees) can run as several calls over
disjoint parts of the items, in threads at once. :func:`thread_count` says into how many parts
a call over ``n`` items is cut: as many as torch is allowed intra-op threads
(``torch.get_num_threads()``, the budget a user sets with ``torch.set_num_threads``; tdreplay's
other host work follows it too), as long as every part gets at least
:data:`MIN_ITEMS_PER_THREAD` items (below that a thread's hand-over costs more than it saves).
:func:`run_parts` runs the parts, the first in the caller's thread.

The threads come from one pool per process, made at first use, and made again when more threads
are needed than it has or in a forked child (a pool's threads do not survive a fork).

Examples
--------
>>> import numpy as np
>>> out = np.zeros(40_000, dtype=np.int64)
>>> def fill(start: int, stop: int) -> int:
...     out[start:stop] = np.arange(start, stop)
...     return stop - start
>>> sum(run_parts(fill, thread_ranges(len(out), 2)))
40000
>>> bool((out == np.arange(40_000)).all())
True
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

import torch

__all__ = ["MIN_ITEMS_PER_THREAD", "MIN_SPLIT_ITEMS", "run_parts", "thread_count", "thread_ranges"]

T = TypeVar("T")

#: Fewest items a thread is given. A prioritized draw of 8,192 slots from a 1M-slot tree takes
#: about 0.4 ms on one core, an update of 8,192 slots 0.1 ms; handing a part to a pool thread
#: costs 10-30 us.
MIN_ITEMS_PER_THREAD = 8192

#: Fewest items of a call that is split (into two parts): smaller calls run as they are.
MIN_SPLIT_ITEMS = 2 * MIN_ITEMS_PER_THREAD

_pool_lock = threading.Lock()
_pool: tuple[int, ThreadPoolExecutor] | None = None  # (threads, pool)


def _forget_pool() -> None:
    """In a forked child: the parent's pool threads are gone (and its lock may be held by one)."""
    global _pool, _pool_lock
    _pool_lock = threading.Lock()
    _pool = None


os.register_at_fork(after_in_child=_forget_pool)


def thread_count(n: int, min_items: int = MIN_ITEMS_PER_THREAD) -> int:
    """Parts a call over ``n`` items is cut into: ``torch.get_num_threads()``, or fewer so that
    each part has ``min_items`` items at least; ``1`` (no split) for a small call.

    Examples
    --------
    >>> thread_count(100)
    1
    """
    if n < 2 * min_items:  # nothing to split, no torch call
        return 1
    return max(1, min(torch.get_num_threads(), n // min_items))


def thread_ranges(n: int, parts: int) -> list[tuple[int, int]]:
    """``[(start, stop), ...]``: ``[0, n)`` cut into ``parts`` contiguous ranges whose sizes
    differ by one at most.

    Examples
    --------
    >>> thread_ranges(20_000, 2)
    [(0, 10000), (10000, 20000)]
    >>> thread_ranges(7, 3)
    [(0, 3), (3, 5), (5, 7)]
    """
    size, extra = divmod(n, parts)
    bounds = [0]
    for part in range(parts):
        bounds.append(bounds[-1] + size + (part < extra))
    return list(zip(bounds[:-1], bounds[1:]))


def _submit(work: Callable[..., T], parts: Sequence[tuple[int, ...]]) -> list[Future[T]]:
    """``work`` over each of ``parts`` in the pool, made (again) first when there is none or it
    has fewer threads than parts. Under the pool's lock, so that a pool is never shut down
    between another caller's getting it and submitting to it."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool[0] < len(parts):
            if _pool is not None:
                _pool[1].shutdown(wait=False)  # its running calls finish; no new ones
            _pool = (len(parts), ThreadPoolExecutor(len(parts), thread_name_prefix="tdreplay"))
        return [_pool[1].submit(work, *args) for args in parts]


def run_parts(work: Callable[..., T], parts: Sequence[tuple[int, ...]]) -> list[T]:
    """``[work(*args) for args in parts]``, the parts run at once in threads (the caller's
    thread runs the first). ``work`` must write only what its part owns, and release the GIL to
    gain anything (numba's ``nogil`` kernels). Returns once every part is done; the first
    exception raised by a part is raised then."""
    if len(parts) == 1:
        return [work(*parts[0])]
    futures = _submit(work, parts[1:])
    try:
        first = work(*parts[0])
    finally:  # the other parts still write into the caller's arrays: wait for them
        for future in futures:
            future.exception()
    return [first, *(future.result() for future in futures)]
