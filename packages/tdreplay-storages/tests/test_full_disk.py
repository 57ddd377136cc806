"""A full disk: checkpoints raise OSError (never SIGBUS) and keep the previous one; a memmap
storage whose first write failed is left as it was, so a retry with room works.

A small tmpfs is mounted for these tests (root and mount(8) needed; skipped otherwise).
"""

from __future__ import annotations

import errno
import multiprocessing as mp
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ReplayBuffer
from tdreplay.core.testing import fill_disk, small_tmpfs
from tdreplay.storages import (
    FlatStorageCheckpointer,
    LazyMemmapStorage,
    LazyTensorStorage,
    NestedStorageCheckpointer,
    TensorStorageCheckpointer,
)

SIZE = 1024 * 1024


@pytest.fixture
def disk(tmp_path):
    with small_tmpfs(tmp_path / "tmpfs", SIZE) as mount:
        yield mount


def fill(disk: Path, leave: int = 0) -> Path:
    """Fill ``disk`` but ``leave`` bytes (roughly: whole pages) with one file."""
    filler = fill_disk(disk)
    if leave:
        with open(filler, "r+b") as f:
            f.truncate(max(filler.stat().st_size - leave, 0))
    return filler


def rows(start: int, n: int, width: int = 4) -> TensorDict:
    i = torch.arange(start, start + n)
    return TensorDict({"obs": i.float().unsqueeze(-1).expand(n, width).clone(), "i": i,
                       ("next", "obs"): i.double().unsqueeze(-1).expand(n, width).clone()},
                      [n])


def _dumps_in_child(storage, path, queue) -> None:
    try:
        storage.dumps(path)
        queue.put("ok")
    except OSError as err:
        queue.put(f"OSError {err.errno}")


@pytest.mark.parametrize("checkpointer", [TensorStorageCheckpointer, NestedStorageCheckpointer,
                                          FlatStorageCheckpointer])
def test_dumps_on_a_full_disk_raises_oserror(disk, checkpointer, tmp_path):
    small = ReplayBuffer(storage=LazyTensorStorage(100, checkpointer=checkpointer()))
    small.extend(rows(0, 10))
    path = disk / "ckpt"
    small.dumps(path)
    entries = sorted(p.name for p in path.iterdir())

    big = ReplayBuffer(storage=LazyTensorStorage(4000, checkpointer=checkpointer()))
    big.extend(rows(0, 4000, width=64))  # ~3 MB: cannot fit
    # in a child: a SIGBUS there kills the child, not the test run
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_dumps_in_child, args=(big, path, queue))
    child.start()
    child.join(120)
    assert child.exitcode == 0, f"the save died with exit code {child.exitcode} (SIGBUS: -7)"
    assert queue.get(timeout=5) == f"OSError {errno.ENOSPC}"
    with pytest.raises(OSError) as err:
        big.dumps(path)
    assert err.value.errno == errno.ENOSPC
    # the file it was writing is named (the flat format's ndarray.tofile gave neither)
    assert err.value.filename is not None and str(path) in str(err.value.filename)
    assert sorted(p.name for p in path.iterdir()) == entries  # previous checkpoint kept
    restored = ReplayBuffer(storage=LazyTensorStorage(100, checkpointer=checkpointer()))
    restored.loads(path)
    assert restored.storage[:]["i"].tolist() == list(range(10))
    assert torch.equal(restored.storage[:]["next", "obs"], small.storage[:]["next", "obs"])


def test_memmap_first_write_on_a_full_disk_leaves_the_storage_as_it_was(disk):
    scratch = disk / "scratch"
    storage = LazyMemmapStorage(20_000, scratch_dir=scratch)
    before = sorted(p.relative_to(scratch) for p in scratch.rglob("*"))
    rb = ReplayBuffer(storage=storage, batch_size=4)
    for _ in range(3):  # every retry fails the same way, not with "choose an empty scratch_dir"
        with pytest.raises(OSError) as err:
            rb.extend(rows(0, 10, width=16))  # 20k rows x (64 + 8 + 128) bytes: 4 MB
        assert err.value.errno == errno.ENOSPC
        assert sorted(p.relative_to(scratch) for p in scratch.rglob("*")) == before
        assert not storage.initialized and len(rb) == 0
    # room again (a smaller storage in the same place): the first write works
    small = LazyMemmapStorage(100, scratch_dir=disk / "other")
    small.set(slice(0, 10), rows(0, 10, width=16))
    assert small[:]["i"].tolist() == list(range(10))


def test_memmap_first_write_retried_after_space_is_freed(disk):
    storage = LazyMemmapStorage(100, scratch_dir=disk / "scratch")
    rb = ReplayBuffer(storage=storage, batch_size=4)
    filler = fill(disk)
    with pytest.raises(OSError):
        rb.extend(rows(0, 10))
    assert not storage.initialized
    filler.unlink()
    rb.extend(rows(0, 10))
    assert rb.storage[:]["i"].tolist() == list(range(10))
    reopened = LazyMemmapStorage(100, scratch_dir=disk / "scratch", existsok=True)
    assert reopened[:]["next", "obs"][:, 0].tolist() == [float(v) for v in range(10)]
