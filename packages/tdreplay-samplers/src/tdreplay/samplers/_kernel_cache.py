"""Compiled numba kernels kept on disk: a process loads them instead of compiling them again.

Compiling the samplers' kernels takes seconds per process (the prioritized sampler's first
``extend``, ``sample`` and ``update_priority`` about 12 s on this project's machine), paid again
by every process that uses them: each worker, each Ray actor, each test run. numba's cache
keeps the compiled code on disk, in ``__pycache__`` beside the module, or in numba's user-wide
cache directory where that is read-only (``NUMBA_CACHE_DIR`` overrides both); a cached kernel
loads in milliseconds, and recompiles when its module's source changes or the CPU differs.

numba checks a cached kernel against the source of its own module only: a change in a kernel
of another module that it calls goes unnoticed (numba's "Notes on Caching"). So only kernels
that call no kernel of another module are cached: the segment trees'
(:mod:`.segment_trees._numba_kernels`) and the trajectory index's
(:mod:`._trajectory_index`). The prioritized sampler's fused kernels
(:mod:`._priority_numba`), which call the trees' kernels, compile in each process, linking the
cached tree kernels (about 2.5 s instead of 12).

Examples
--------
>>> from numba import njit
>>> @on_disk
... @njit(nogil=True)
... def double(x):
...     return 2 * x
>>> double(21)
42
"""

from __future__ import annotations

import contextlib
from typing import TypeVar

__all__ = ["on_disk"]

KernelT = TypeVar("KernelT")


def on_disk(kernel: KernelT) -> KernelT:
    """``kernel`` (a numba dispatcher), its compiled code now kept on disk (see the module
    docstring). Where numba finds no writable place for a cache, the kernel compiles in each
    process, as without this decorator; it is returned either way."""
    # numba raises "cannot cache function ...: no locator available for file ..."
    with contextlib.suppress(RuntimeError):
        kernel.enable_caching()  # type: ignore[attr-defined]
    return kernel
