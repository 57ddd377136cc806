"""Compiled numba kernels kept on disk: a process loads them instead of compiling them again.

Compiling the samplers' kernels takes seconds per process (the prioritized sampler's first
``extend``, ``sample`` and ``update_priority`` about 12 s on this project's machine), paid again
by every process that uses them: each worker, each Ray actor, each test run. numba's cache
keeps the compiled code on disk, in ``__pycache__`` beside the module, or in numba's user-wide
cache directory where that is read-only (``NUMBA_CACHE_DIR`` overrides both); a cached kernel
loads in milliseconds, and recompiles when its module's source changes or the CPU differs.

numba checks a cached kernel against the source of its own module only: a change in a kernel
of another module that it calls goes unnoticed (numba's "Notes on Caching"), since the cached
code holds the callee's code too. numba's cache key does hold the values a kernel closes
over, though. So a kernel that calls kernels of other modules is built by a factory that
closes over :func:`source_fingerprint` of those modules and names it in its body: a change in
any of them is a new key, and the kernel compiles again instead of loading stale code. The
prioritized sampler's fused kernels (:mod:`._priority_numba`) are built that way; the segment
trees' (:mod:`.segment_trees._numba_kernels`) and the trajectory index's
(:mod:`._trajectory_index`) call no kernel of another module.

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
import hashlib
from pathlib import Path
from types import ModuleType
from typing import TypeVar

__all__ = ["on_disk", "source_fingerprint"]

KernelT = TypeVar("KernelT")


def on_disk(kernel: KernelT) -> KernelT:
    """``kernel`` (a numba dispatcher), its compiled code now kept on disk (see the module
    docstring). Where numba finds no writable place for a cache, the kernel compiles in each
    process, as without this decorator; it is returned either way."""
    # numba raises "cannot cache function ...: no locator available for file ..."
    with contextlib.suppress(RuntimeError):
        kernel.enable_caching()  # type: ignore[attr-defined]
    return kernel


def source_fingerprint(*modules: ModuleType) -> int:
    """A 63-bit hash of the files ``modules`` were loaded from: it changes when any of them
    changes. A kernel that calls kernels of ``modules`` closes over it to be part of numba's
    cache key (see the module docstring).

    >>> import tdreplay.samplers._kernel_cache as this
    >>> source_fingerprint(this) == source_fingerprint(this) >= 0
    True
    """
    digest = hashlib.blake2b(digest_size=8)
    for module in modules:
        if module.__file__ is None:
            raise ValueError(f"modules: {module.__name__} was not loaded from a file")
        digest.update(Path(module.__file__).read_bytes())
    return int.from_bytes(digest.digest(), "little") >> 1
