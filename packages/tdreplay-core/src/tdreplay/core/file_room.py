"""Room on disk for memory-mapped files, taken before anything is written through a mapping.

``TensorDict.memmap_like`` (and ``memmap``) size their files with ``ftruncate``: the files are
sparse, and a write through the mapping on a full disk (or ``/dev/shm``) kills the process
with ``SIGBUS``, which Python cannot catch. :func:`reserve_mapped_files` allocates their blocks
first (``posix_fallocate``), so a full disk raises ``OSError`` (``ENOSPC``) naming the file
instead, before any write.
"""

from __future__ import annotations

import errno
import os
from typing import Any

from tensordict import MemoryMappedTensor, TensorDictBase

__all__ = ["reserve_file", "reserve_mapped_files"]

#: errors of a file system that cannot allocate in advance (the file is sized already)
_CANNOT_RESERVE = (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS)


def reserve_file(path: str | os.PathLike[str], nbytes: int) -> None:
    """Allocate the first ``nbytes`` bytes of the file ``path`` (created if missing) on its
    file system, before a write that cannot report a failure (through a memory mapping, where
    a full disk is ``SIGBUS``; the HDF5 library, which crashes on some failed writes):
    ``OSError`` naming ``path`` when there is no room (``ENOSPC``) or the file may not grow
    (``EFBIG``); nothing is checked on a file system or platform that cannot allocate ahead.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     path = os.path.join(d, "rows.memmap")
    ...     open(path, "wb").close()
    ...     reserve_file(path, 4096)
    ...     os.path.getsize(path) >= 4096
    True
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if nbytes > 0 and hasattr(os, "posix_fallocate"):
            os.posix_fallocate(fd, 0, nbytes)
    except OSError as err:
        if err.errno in _CANNOT_RESERVE:
            return
        raise OSError(err.errno, f"{err.strerror} (reserving {nbytes} bytes before writing "
                                 "through a memory mapping)", os.fspath(path)) from err
    finally:
        os.close(fd)


def reserve_mapped_files(data: TensorDictBase) -> None:
    """:func:`reserve_file` of every memory-mapped leaf of ``data`` (what ``memmap_like`` laid
    out), before anything is written into them.

    Examples
    --------
    >>> import tempfile, torch
    >>> from tensordict import TensorDict
    >>> with tempfile.TemporaryDirectory() as d:
    ...     td = TensorDict({"x": torch.zeros(1000, 8)}, [1000]).memmap_like(d, num_threads=0)
    ...     reserve_mapped_files(td)
    ...     os.stat(td["x"].filename).st_blocks * 512 >= 8000 * 4
    True
    """
    for leaf in data.values(include_nested=True, leaves_only=True):
        filename: Any = getattr(leaf, "filename", None)
        if isinstance(leaf, MemoryMappedTensor) and filename is not None:
            reserve_file(filename, leaf.numel() * leaf.element_size())
