"""Memory-mapped checkpoint files written with ``write(2)``, never through a mapping.

``TensorDict.memmap`` copies each leaf into a file mapped in memory. On a full disk (or a full
tmpfs such as ``/dev/shm``) a store into a page the file system cannot back kills the process
with ``SIGBUS``: no exception, no cleanup, the previous checkpoint's lock left to the kernel.
:func:`memmap_by_writes` lays the files out the same way (``memmap_like``: ``meta.json`` and
sized, sparse leaf files; no page is touched), then fills each leaf file with ordinary writes,
so a full disk raises ``OSError(ENOSPC)`` and the caller (the checkpoint format) removes the
half-written snapshot and keeps the previous one. The result loads with
``TensorDict.load_memmap`` as before.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from tensordict import MemoryMappedTensor, TensorDictBase

_CHUNK = 1 << 22  # bytes per write


def _write_all(filename: str, tensor: torch.Tensor) -> None:
    data = tensor.detach().to("cpu").contiguous().reshape(-1)
    if not data.numel():
        return  # memmap_like makes no file for an empty leaf (nor does memmap)
    raw = data.view(torch.uint8).numpy().data
    fd = os.open(filename, os.O_WRONLY)
    try:
        offset = 0
        while offset < len(raw):
            offset += os.pwrite(fd, raw[offset:offset + _CHUNK], offset)
    finally:
        os.close(fd)


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
