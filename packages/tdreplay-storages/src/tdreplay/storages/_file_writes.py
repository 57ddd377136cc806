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

While a file is written, a worker thread calls ``fdatasync`` on it every 16 MiB (one call at
a time), so the disk writes back the first chunks while the next ones are copied; the
``fsync`` after the last write, which makes the file durable, then waits for the tail alone.
A 1M-row memmap buffer's ``dumps`` (277 MB) took 0.87-0.98 s with each file written, then
fsynced, and takes 0.57-0.65 s so (this project's machine, ext4).
"""

from __future__ import annotations

import json
import os
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import MemoryMappedTensor, TensorDictBase

from tdreplay.core.atomic_files import replace_file
from tdreplay.core.checkpoint import named_write_error, record_written_file
from tdreplay.core.file_room import sized_like

_CHUNK = 1 << 22  # bytes per write
_SYNC_EVERY = 4  # chunks written between two background fdatasync calls


def _write_all(filename: str, tensor: torch.Tensor, syncer: ThreadPoolExecutor) -> None:
    """Write ``tensor``'s bytes into ``filename``, fsync it, and hand the checkpoint being
    written the CRC-32 of those bytes, computed while writing (no read-back at commit).
    ``syncer`` runs the early ``fdatasync`` calls (see the module docstring)."""
    if tensor.is_nested:  # (strided: memmap_like laid its parts out back to back, as here)
        tensor = torch.cat([part.reshape(-1) for part in tensor.detach().unbind(0)])
    data = tensor.detach().to("cpu").contiguous().reshape(-1)
    if not data.numel():
        return  # memmap_like makes no file for an empty leaf (nor does memmap)
    raw = data.view(torch.uint8).numpy().data
    try:
        crc = _write_and_sync(filename, raw, syncer)
    except OSError as err:
        if err.filename is not None:
            raise
        raise named_write_error(err, filename) from err
    record_written_file(filename, crc)


def _write_and_sync(filename: str, raw: Any, syncer: ThreadPoolExecutor) -> int:
    """The writes and syncs of :func:`_write_all`; the CRC-32 of the bytes written."""
    fd = os.open(filename, os.O_WRONLY)
    crc = 0
    early_sync: Future[None] | None = None
    try:
        offset = chunks = 0
        while offset < len(raw):
            chunk = raw[offset:offset + _CHUNK]
            written = os.pwrite(fd, chunk, offset)
            crc = zlib.crc32(chunk[:written], crc)
            offset += written
            chunks += 1
            if chunks % _SYNC_EVERY == 0 and (early_sync is None or early_sync.done()):
                early_sync = syncer.submit(os.fdatasync, fd)
        if early_sync is not None:
            early_sync.result()  # its error (EIO, ENOSPC) is this write's
        os.fsync(fd)
    finally:
        if early_sync is not None:
            early_sync.exception()  # wait: the fd must not be closed (and reused) under it
        os.close(fd)
    return crc


def write_array_file(path: Path, array: Any) -> None:
    """Write the bytes of ``array`` (a contiguous numpy array) to a new file ``path`` with
    plain writes. Unlike ``ndarray.tofile``, whose short write on a full disk raises an
    ``OSError`` without errno nor file name ("N requested and M written"), a failed write
    raises the system's ``OSError`` (``ENOSPC``...) naming ``path``.

    Examples
    --------
    >>> import tempfile, numpy as np
    >>> with tempfile.TemporaryDirectory() as d:
    ...     write_array_file(Path(d) / "a.bin", np.arange(3, dtype=np.int64))
    ...     print(np.fromfile(Path(d) / "a.bin", dtype=np.int64).tolist())
    [0, 1, 2]
    """
    raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8).data
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            while raw:
                raw = raw[os.write(fd, raw):]
        finally:
            os.close(fd)
    except OSError as err:
        raise named_write_error(err, path) from err


def memmap_by_writes(td: TensorDictBase, prefix: Path) -> None:
    """Save ``td`` under ``prefix`` in ``TensorDict.memmap``'s format with plain writes.

    Raises ``OSError`` naming the file (``ENOSPC`` on a full disk, ``EFBIG`` past a file-size
    limit) instead of dying of ``SIGBUS`` (or torch's ``RuntimeError`` of a file it could not
    size); what was written is left for the caller to remove.

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
    layout = sized_like(td, prefix, "sizing a checkpoint file")
    files = {}
    for key, leaf in layout.items(include_nested=True, leaves_only=True):
        if not isinstance(leaf, MemoryMappedTensor) or leaf.filename is None:
            raise TypeError(f"entry {key!r} was not laid out as a memory-mapped file.")
        files[key] = str(leaf.filename)
    del layout  # unmap: the files are filled through write(2) only
    with ThreadPoolExecutor(1, thread_name_prefix="tdreplay-fdatasync") as syncer:
        for key, filename in files.items():
            _write_all(filename, td.get(key), syncer)


def write_json_file(path: Path, obj: Any) -> None:
    """Write ``obj`` as JSON at ``path`` atomically: into a temporary file beside it, fsynced,
    then renamed over ``path`` (a reader never sees half a file; a full disk raises
    ``OSError`` and leaves ``path`` as it was). The checkpoint being written is handed the
    file's CRC-32, as :func:`memmap_by_writes` hands its files'.

    Examples
    --------
    >>> import json, tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     write_json_file(Path(d) / "a.json", {"values": ["x", 1, None]})
    ...     print(json.loads((Path(d) / "a.json").read_text()))
    {'values': ['x', 1, None]}
    """
    raw = json.dumps(obj).encode()
    try:
        replace_file(path, raw)
    except OSError as err:
        raise named_write_error(err, path) from err
    record_written_file(path, zlib.crc32(raw))

