"""Checkpoint leaves written with write(2) (_file_writes.memmap_by_writes): files of many chunks
come back byte for byte with the CRC-32 of what was written; the early fdatasync calls run
while the file is written, and an error of theirs fails the write (the fd is not left open)."""

from __future__ import annotations

import errno
import os
import zlib

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core.checkpoint import verify_checkpoint, write_checkpoint
from tdreplay.storages import _file_writes

CHUNK_BYTES = 1 << 22


def big_td() -> TensorDict:
    """One leaf of 10 chunks and a bit (room for early syncs after chunks 4 and 8), one small
    leaf."""
    n = (10 * CHUNK_BYTES + 12_345) // 4
    return TensorDict({"big": torch.arange(n, dtype=torch.int32),
                       ("nested", "small"): torch.ones(3, 2)}, [])


def test_a_file_of_many_chunks_comes_back_whole_with_its_crc(tmp_path):
    td = big_td()
    with write_checkpoint(tmp_path) as snap:
        _file_writes.memmap_by_writes(td, snap)
    loaded = TensorDict.load_memmap(verify_checkpoint(tmp_path))  # checks every CRC
    assert torch.equal(loaded["big"], td["big"])
    assert torch.equal(loaded["nested", "small"], td["nested", "small"])
    raw = (verify_checkpoint(tmp_path) / "big.memmap").read_bytes()
    assert zlib.crc32(raw) == zlib.crc32(td["big"].numpy().tobytes())


def test_an_early_fdatasync_every_fourth_chunk_one_at_a_time(tmp_path, monkeypatch):
    synced = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (synced.append(fd), real(fd))[1])
    _file_writes.memmap_by_writes(big_td(), tmp_path)
    assert 1 <= len(synced) <= 2  # every 4th chunk of 10, skipped while one still runs


def test_an_error_of_an_early_sync_fails_the_write_and_closes_the_file(tmp_path, monkeypatch):
    def failing(fd):
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(os, "fdatasync", failing)
    opened, closed = [], []
    real_open, real_close = os.open, os.close
    monkeypatch.setattr(os, "open", lambda *a, **k: opened.append(real_open(*a, **k)) or opened[-1])
    monkeypatch.setattr(os, "close", lambda fd: (closed.append(fd), real_close(fd))[1])
    with pytest.raises(OSError) as err:
        _file_writes.memmap_by_writes(big_td(), tmp_path)
    assert err.value.errno == errno.EIO
    assert opened and sorted(opened) == sorted(closed)  # no descriptor left open
