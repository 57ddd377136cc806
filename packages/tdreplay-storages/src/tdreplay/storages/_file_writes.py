"""Memory-mapped checkpoint files written with ``write(2)``, never through a mapping.

``TensorDict.memmap`` copies each leaf into a file mapped in memory. On a full disk (or a full
tmpfs such as ``/dev/shm``) a store into a page the file system cannot back kills the process
with ``SIGBUS``: no exception, no cleanup, the previous checkpoint's lock left to the kernel.
:func:`memmap_by_writes` lays the files out the same way (``memmap_like``: ``meta.json`` and
sized, sparse leaf files; no page is touched), then fills each leaf file with ordinary writes,
so a full disk raises ``OSError(ENOSPC)`` and the caller (the checkpoint format) removes the
half-written snapshot and keeps the previous one. The result loads with
``TensorDict.load_memmap`` as before. Each file is fsynced as it is written and its CRC-32
computed over the bytes written (:func:`~tdreplay.core.checkpoint.record_written_file`), so
a checkpoint's commit need not read it back.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import torch
from tensordict import MemoryMappedTensor, TensorDictBase

from tdreplay.core.checkpoint import record_written_file

_CHUNK = 1 << 22  # bytes per write


def _write_all(filename: str, tensor: torch.Tensor) -> None:
    """Write ``tensor``'s bytes into ``filename``, fsync it, and hand the checkpoint being
    written the CRC-32 of those bytes, computed while writing (no read-back at commit)."""
    data = tensor.detach().to("cpu").contiguous().reshape(-1)
    if not data.numel():
        return  # memmap_like makes no file for an empty leaf (nor does memmap)
    raw = data.view(torch.uint8).numpy().data
    fd = os.open(filename, os.O_WRONLY)
    crc = 0
    try:
        offset = 0
        while offset < len(raw):
            chunk = raw[offset:offset + _CHUNK]
            written = os.pwrite(fd, chunk, offset)
            crc = zlib.crc32(chunk[:written], crc)
            offset += written
        os.fsync(fd)
    finally:
        os.close(fd)
    record_written_file(filename, crc)


def memmap_by_writes(td: TensorDictBase, prefix: Path) -> None:
    """Save ``td`` under ``prefix`` in ``TensorDict.memmap``'s format with plain writes.

    Raises ``OSError`` (``ENOSPC`` on a full disk) instead of dying of ``SIGBUS``; what was
    written is left for the caller to remove.

    Examples
    --------
    >>> import tempfile
    >>> from tensordict import TensorDict
    >>> td = TensorDict({"a": torch.arange(4), ("n", "b"): torch.ones(4, 2)}, [4])
    >>> with tempfile.TemporaryDirectory() as d:
    ...     memmap_by_writes(td, Path(d))
    ...     back = TensorDict.load_memmap(d)
    ...     print(back["a"].tolist(), back["n", "b"].sum().item())
    [0, 1, 2, 3] 8.0
    """
    layout = td.memmap_like(prefix, num_threads=0)
    files = {}
    for key, leaf in layout.items(include_nested=True, leaves_only=True):
        if not isinstance(leaf, MemoryMappedTensor) or leaf.filename is None:
            raise TypeError(f"entry {key!r} was not laid out as a memory-mapped file.")
        files[key] = str(leaf.filename)
    del layout  # unmap: the files are filled through write(2) only
    for key, filename in files.items():
        _write_all(filename, td.get(key))
