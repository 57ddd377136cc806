"""A process killed during the first write of a LazyMemmapStorage (while it lays the files
out) leaves nothing that stops the next first write: its files are recognised and replaced,
by the handles that already exist and by new ones; files the storage did not create are still
never overwritten."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
from pathlib import Path

import pytest
import torch
from tensordict import MemoryMappedTensor, TensorDict

import tdreplay.storages.memmap_storage as memmap_storage
from tdreplay.core import ReplayBuffer
from tdreplay.storages import LazyMemmapStorage

CAP = 10


def rows(ids) -> TensorDict:
    ids = torch.as_tensor(ids)
    n = len(ids)
    return TensorDict({"id": ids, ("next", "obs"): ids.float().unsqueeze(-1).expand(n, 3).clone(),
                       ("other", "x"): ids.double(), "z": -ids}, [n])


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def dies_laying_out(rb: ReplayBuffer, point: str) -> None:
    """In a forked child: the first write, killed at ``point``."""
    if point.startswith("reserved"):  # after the n-th leaf file is created and sized
        real_reserve, count = memmap_storage._reserve, int(point[-1])

        def reserve(filename, nbytes):
            real_reserve(filename, nbytes)
            reserve.calls += 1
            if reserve.calls == count:
                die()
        reserve.calls = 0
        memmap_storage._reserve = reserve
    elif point == "creating_nested_leaf":  # next/obs.memmap made, other/ too, not other/x
        real_empty = MemoryMappedTensor.empty

        def empty(*args, filename=None, **kwargs):
            if Path(filename).parent.name == "other":
                die()
            return real_empty(*args, filename=filename, **kwargs)
        MemoryMappedTensor.empty = empty
    elif point == "layout_written":  # the layout file in place, not yet committed
        real_write = LazyMemmapStorage._write_layout

        def write_layout(self):
            real_write(self)
            die()
        LazyMemmapStorage._write_layout = write_layout  # type: ignore[method-assign]
    rb.extend(rows([0, 1, 2, 3]))


def crash_first_write(rb: ReplayBuffer, point: str) -> None:
    p = mp.get_context("fork").Process(target=dies_laying_out, args=(rb, point))
    p.start()
    p.join(60)
    assert p.exitcode == -signal.SIGKILL


def files(path: Path) -> list[str]:
    return sorted(p.relative_to(path).as_posix() for p in path.rglob("*"))


POINTS = ["reserved1", "reserved2", "reserved3", "creating_nested_leaf", "layout_written"]


@pytest.mark.parametrize("point", POINTS)
def test_the_same_handle_writes_after_a_killed_first_write(tmp_path, point):
    rb = ReplayBuffer(storage=LazyMemmapStorage(CAP, scratch_dir=tmp_path / "s"), batch_size=2)
    crash_first_write(rb, point)
    assert len(rb) == 0
    rb.extend(rows([7, 8, 9]))
    assert rb.storage[:]["id"].tolist() == [7, 8, 9]
    assert rb.storage[:]["next", "obs"][:, 2].tolist() == [7.0, 8.0, 9.0]
    # the files are those of a storage written once, nothing of the dead write left
    clean = LazyMemmapStorage(CAP, scratch_dir=tmp_path / "clean")
    clean.set(slice(0, 3), rows([7, 8, 9]))
    assert files(tmp_path / "s") == files(tmp_path / "clean")


@pytest.mark.parametrize("point", POINTS)
def test_a_new_handle_writes_after_a_killed_first_write(tmp_path, point):
    rb = ReplayBuffer(storage=LazyMemmapStorage(CAP, scratch_dir=tmp_path / "s"), batch_size=2)
    crash_first_write(rb, point)
    reopened = ReplayBuffer(storage=LazyMemmapStorage(CAP, scratch_dir=tmp_path / "s",
                                                      existsok=True), batch_size=2)
    assert len(reopened) == 0
    reopened.extend(rows([4, 5]))
    assert reopened.storage[:]["z"].tolist() == [-4, -5]
    rb.extend(rows([6]))  # the first handle maps the new layout
    assert rb.storage[:]["id"].tolist() == [4, 5, 6]


def test_foreign_files_stay_refused_after_a_killed_first_write(tmp_path):
    scratch = tmp_path / "s"
    rb = ReplayBuffer(storage=LazyMemmapStorage(CAP, scratch_dir=scratch), batch_size=2)
    crash_first_write(rb, "reserved2")
    (scratch / "w.memmap").write_bytes(b"not the storage's")  # someone else's file
    with pytest.raises(FileExistsError, match="w.memmap"):
        rb.extend(rows([1, 2]).set("w", torch.zeros(2)))
    assert (scratch / "w.memmap").read_bytes() == b"not the storage's"
    rb.extend(rows([1, 2]))
    assert rb.storage[:]["id"].tolist() == [1, 2]
    assert (scratch / "w.memmap").read_bytes() == b"not the storage's"
