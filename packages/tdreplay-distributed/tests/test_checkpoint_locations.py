"""Checkpoint locations every node reaches: fsspec URLs (``memory://`` in this process,
``file://`` across the actors' processes), committed by one pointer write."""

from __future__ import annotations

import os
import sys
import tempfile

import fsspec
import pytest
import torch
from distributed_workers import make_batch
from fsspec.implementations.memory import MemoryFileSystem

from tdreplay.core import CheckpointError, ReplayBuffer
from tdreplay.distributed.checkpoints import (
    POINTER,
    load_checkpoint,
    save_checkpoint,
    write_text,
)
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage

STORAGES = {"tensor": lambda: LazyTensorStorage(10),
            "memmap": lambda: LazyMemmapStorage(10, scratch_dir=tempfile.mkdtemp())}


@pytest.fixture
def memory_url(request):
    url = f"memory://tdreplay-tests/{request.node.name.replace('[', '-').rstrip(']')}"
    yield url
    fs, path = fsspec.core.url_to_fs(url)
    if fs.exists(path):
        fs.rm(path, recursive=True)


@pytest.mark.parametrize("storage", sorted(STORAGES))
def test_a_checkpoint_at_a_url_restores_the_buffer_and_keeps_one_snapshot(storage, memory_url):
    rb = ReplayBuffer(storage=STORAGES[storage]())
    rb.extend(torch.arange(5.0))
    save_checkpoint(rb, memory_url)
    rb.extend(torch.arange(10.0, 13.0))
    save_checkpoint(rb, memory_url)  # replaces the first
    fs, path = fsspec.core.url_to_fs(memory_url)
    names = sorted(entry.rsplit("/", 1)[-1] for entry in fs.ls(path, detail=False))
    assert names[0] == POINTER and len(names) == 2 and names[1].startswith("snapshot-")
    restored = ReplayBuffer(storage=STORAGES[storage]())
    load_checkpoint(restored, memory_url)
    assert restored[:].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 10.0, 11.0, 12.0]
    assert restored.write_count == 8


def test_a_save_that_fails_before_its_commit_leaves_the_previous_checkpoint(memory_url,
                                                                           monkeypatch):
    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    rb.extend(torch.arange(3.0))
    save_checkpoint(rb, memory_url)
    rb.extend(torch.arange(3.0, 6.0))

    def store_fails(self, path, value, **kwargs):
        raise OSError("the object store refused the write")

    with monkeypatch.context() as patched:
        patched.setattr(MemoryFileSystem, "pipe_file", store_fails)  # the pointer's write
        with pytest.raises(OSError, match="refused"):
            save_checkpoint(rb, memory_url)
    restored = ReplayBuffer(storage=LazyTensorStorage(10))
    load_checkpoint(restored, memory_url)
    assert restored[:].tolist() == [0.0, 1.0, 2.0]  # the snapshot the pointer names


def test_missing_and_dangling_checkpoints_at_a_url_are_refused(memory_url):
    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    with pytest.raises(CheckpointError, match="no checkpoint at .*never committed"):
        load_checkpoint(rb, memory_url)
    write_text(f"{memory_url}/{POINTER}", "snapshot-0-gone")
    with pytest.raises(CheckpointError, match="names a snapshot 'snapshot-0-gone' that is not"):
        load_checkpoint(rb, memory_url)
    assert len(rb) == 0


def test_a_url_without_fsspec_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "fsspec", None)  # import fsspec raises ImportError
    with pytest.raises(ImportError, match=r"tdreplay-distributed\[fsspec\].*every node mounts"):
        save_checkpoint(ReplayBuffer(storage=LazyTensorStorage(2)), "s3://bucket/replay")


def test_a_buffer_actor_saves_to_and_restores_from_a_file_url(shared_td, tmp_path):
    url = f"file://{tmp_path}/replay"  # a URL every process of this machine reaches
    shared_td.extend(make_batch(0, 0, 6))
    shared_td.dumps(url)
    shared_td.extend(make_batch(0, 1, 4))
    assert len(shared_td) == 10
    shared_td.loads(url)
    assert len(shared_td) == 6 and shared_td[:]["seq"].tolist() == [0] * 6
    assert (tmp_path / "replay" / POINTER).read_text().startswith("snapshot-")


def test_a_manifest_rewrite_that_fails_leaves_the_old_one_and_no_temporary(tmp_path,
                                                                           monkeypatch):
    import errno

    from tdreplay.core import atomic_files

    manifest = tmp_path / "shards.json"
    write_text(str(manifest), '{"num_shards": 2}')

    def full_disk(fd, mode):
        os.close(fd)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic_files.os, "fdopen", full_disk)
    with pytest.raises(OSError, match="No space left"):
        write_text(str(manifest), '{"num_shards": 4}')
    assert manifest.read_text() == '{"num_shards": 2}'
    assert [p.name for p in tmp_path.iterdir()] == ["shards.json"]
