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
import re
from pathlib import Path
from typing import Any

from tensordict import MemoryMappedTensor, TensorDictBase

__all__ = ["mapped_like", "reserve_file", "reserve_mapped_files", "sized_like",
           "torch_file_error"]

#: errors of a file system that cannot allocate in advance (the file is sized already)
_CANNOT_RESERVE = (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS)
#: the errors of a file that may not grow: a full disk, a file-size limit (``RLIMIT_FSIZE``,
#: FAT32's 4 GiB), a full quota
_NO_ROOM = frozenset(code for code in (errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", None))
                     if code is not None)
#: how torch reports a file it could not size ("unable to resize file <path> to the right
#: size: File too large (27)")
_TORCH_FILE_ERROR = re.compile(r"<(?P<file>[^<>]+)>[^<>]*?: (?P<strerror>[^:()]+) "
                               r"\((?P<errno>\d+)\)")


def torch_file_error(err: BaseException, what: str) -> OSError | None:
    """The ``OSError`` (errno, message, file name) that torch's ``RuntimeError`` ``err``
    reports, when it is a file that could not be sized for lack of room (``ENOSPC``,
    ``EFBIG``, ``EDQUOT``); ``None`` for any other error. ``what`` says what the file was
    for.

    Examples
    --------
    >>> err = RuntimeError("unable to resize file </tmp/c/obs.memmap> to the right size: "
    ...                    "File too large (27)")
    >>> found = torch_file_error(err, "writing a checkpoint file")
    >>> found.errno == errno.EFBIG, found.filename
    (True, '/tmp/c/obs.memmap')
    >>> torch_file_error(RuntimeError("shape mismatch"), "writing") is None
    True
    """
    match = _TORCH_FILE_ERROR.search(str(err))
    if match is None or int(match["errno"]) not in _NO_ROOM:
        return None
    code = int(match["errno"])
    return OSError(code, f"{os.strerror(code)} ({what})", match["file"])


def mapped_like(data: TensorDictBase, prefix: str | os.PathLike[str], what: str
                ) -> TensorDictBase:
    """``data.memmap_like(prefix)`` (files of ``data``'s shapes and dtypes under ``prefix``)
    with the room for every file taken (:func:`reserve_mapped_files`): a full disk or a
    file-size limit raises ``OSError`` naming the file (``ENOSPC``, ``EFBIG``; ``what`` says
    what the files are for) where torch raises a ``RuntimeError`` when it cannot size a file,
    and a write through the mapping would die of ``SIGBUS``.

    Examples
    --------
    >>> import tempfile, torch
    >>> from tensordict import TensorDict
    >>> with tempfile.TemporaryDirectory() as d:
    ...     files = mapped_like(TensorDict({"x": torch.ones(4, 2)}, [4]), d, "a dataset")
    ...     print(files["x"].shape, float(files["x"].sum()))
    torch.Size([4, 2]) 0.0
    """
    mapped = sized_like(data, prefix, what)
    reserve_mapped_files(mapped)
    return mapped


def sized_like(data: TensorDictBase, prefix: str | os.PathLike[str], what: str
               ) -> TensorDictBase:
    """``data.memmap_like(prefix)``: sized, sparse files of ``data``'s shapes and dtypes
    (``meta.json`` with them), nothing reserved (for files filled with plain writes, which
    report a full disk themselves); ``OSError`` naming the file (``what``: what the files are
    for) where torch's ``RuntimeError`` says it could not size one (:func:`torch_file_error`).

    Examples
    --------
    >>> import tempfile, torch
    >>> from tensordict import TensorDict
    >>> with tempfile.TemporaryDirectory() as d:
    ...     files = sized_like(TensorDict({"x": torch.ones(3)}, [3]), d, "a checkpoint")
    ...     print(files["x"].tolist())
    [0.0, 0.0, 0.0]
    """
    try:
        return data.memmap_like(Path(prefix), num_threads=0)
    except RuntimeError as err:  # torch's report of a file it could not size (EFBIG...)
        named = torch_file_error(err, what)
        if named is None:
            raise
        raise named from err


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
