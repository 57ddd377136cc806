"""The recovery of torn rows (a LazyMemmapStorage whose writer died mid-overwrite) survives
being killed itself: whoever takes the lock next finishes it, each move applied once, and the
rows are those of a recovery never interrupted (whole rows, oldest first)."""

from __future__ import annotations

import errno
import os
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ReplayBuffer
from tdreplay.storages import LazyMemmapStorage
from tdreplay.storages import _torn_writes as torn_writes
from tdreplay.storages._layout import TensorLayout
from tdreplay.storages._memmap_shared import _STATE_SIZE

CAP = 10


def rows(ids) -> TensorDict:
    ids = torch.as_tensor(ids)
    n = len(ids)
    return TensorDict({"id": ids, "a": ids.double().unsqueeze(-1).expand(n, 3).clone(),
                       "b": (ids % 2 == 0), ("next", "z"): (-ids).float()}, [n])


def read_ids(storage: LazyMemmapStorage) -> list[int]:
    """The ids of the counted rows; every row must be whole (its leaves from one write)."""
    td = storage[:]
    ids = td["id"]
    ok = ((td["a"] == ids.double().unsqueeze(-1)).all(-1) & (td["b"] == (ids % 2 == 0))
          & (td["next", "z"] == (-ids).float()))
    assert bool(ok.all()), f"rows mixing leaves of different rows: {ids[~ok].tolist()}"
    return ids.tolist()


# ---- the moves, in one process: interrupted at every copy, then finished ---------------------
class Counters:
    def __init__(self) -> None:
        self.array = np.zeros(_STATE_SIZE, dtype=np.int64)  # (the shared state array)


class Interrupted(Exception):
    pass


def expected_after(ids: list[int], written: int, cursor: int, torn: list[int]) -> list[int]:
    """The kept rows, oldest first (from the cursor round)."""
    start = cursor if cursor < written else 0
    order = [(start + i) % written for i in range(written)]
    return [ids[i] for i in order if i not in set(torn)]


def recover_case(seed: int, directory: Path, monkeypatch, interrupt_at: int | None) -> int:
    """A random storage with torn rows, recovered with an interruption (an exception, the
    destination being written left holding garbage) at copy ``interrupt_at``, then recovered
    again by a fresh record holder with another step size; returns the copies made."""
    rng = random.Random(seed)
    cap = rng.randint(1, 30)
    written = rng.randint(1, cap)
    cursor = rng.randint(0, cap - 1) if written == cap else rng.choice([written % cap, 0])
    torn = sorted(rng.sample(range(written), rng.randint(1, written)))
    ids = torch.arange(cap) * 10 + 1
    td = rows(ids)
    layout = TensorLayout(td, ndim=1, device=torch.device("cpu"))
    counters = Counters()
    counters.array[1:3] = written, cursor
    journal = directory / "tdreplay-memmap-torn.bin"
    np.array(torn, dtype=np.int64).tofile(journal)
    counters.array[4] = 2  # a journal of scattered rows, its writer dead
    expected = expected_after(ids.tolist(), written, cursor, torn)

    row_bytes = 8 + 24 + 1 + 4
    monkeypatch.setattr(torn_writes, "STAGE_BYTES", rng.choice([1, 2, 3, 7, 100]) * row_bytes,
                        raising=False)
    copies = 0
    real_copy = torch.Tensor.copy_

    def copy_(self, src, *args, **kwargs):
        nonlocal copies
        copies += 1
        if copies == interrupt_at:
            self.fill_(7)
            raise Interrupted
        return real_copy(self, src, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "copy_", copy_)
    try:
        torn_writes.TornWrites(counters, journal).recover(layout)
    except Interrupted:
        pass
    monkeypatch.setattr(torn_writes, "STAGE_BYTES", 16 << 20, raising=False)
    torn_writes.TornWrites(counters, journal).recover(layout)
    monkeypatch.setattr(torch.Tensor, "copy_", real_copy)

    n = int(counters.array[1])
    assert td["id"][:n].tolist() == expected, (seed, interrupt_at)
    assert td["a"][:n, 0].tolist() == [float(i) for i in expected]
    assert td["b"][:n].tolist() == [i % 2 == 0 for i in expected]
    assert td["next", "z"][:n].tolist() == [-float(i) for i in expected]
    assert int(counters.array[2]) == n % cap and not counters.array[4]
    assert not list(directory.iterdir())  # journal, plan and staging file removed
    return copies


@pytest.mark.parametrize("seed", range(40))
def test_recovery_interrupted_at_any_copy_finishes_it_exactly_once(tmp_path, monkeypatch, seed):
    (tmp_path / "whole").mkdir()
    copies = recover_case(seed, tmp_path / "whole", monkeypatch, None)
    for interrupt_at in range(1, copies + 1):
        directory = tmp_path / f"cut{interrupt_at}"
        directory.mkdir()
        recover_case(seed, directory, monkeypatch, interrupt_at)


@pytest.mark.parametrize("written, cursor, torn", [
    (10, 3, [3, 4, 5]),  # a full ring's writer died (rows at the cursor)
    (10, 8, [0, 1, 8, 9]),  # ... its write wrapping round the end
    (7, 7, [4]),  # an in-place edit of a ring not full
    (10, 0, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]),  # every row torn
    (6, 6, [0, 2, 5]),
])
def test_recovery_steps_keep_the_rows_oldest_first(written, cursor, torn):
    for block in (1, 2, 3, 4, 100):
        values = list(range(written))
        for step in torn_writes.recovery_steps(written, cursor, torn, block):
            read = [values[s:s + n][::-1] if rev else values[s:s + n] for s, _, n, rev in step]
            assert all(n <= max(block, 1) for _, _, n, _ in step)
            for (_, dst, n, _), got in zip(step, read):
                values[dst:dst + n] = got
        kept = written - len(torn)
        assert values[:kept] == expected_after(list(range(written)), written, cursor, torn)


# ---- real processes, killed ----------------------------------------------------------------------
def writer_dies(killed, path: Path) -> None:
    """Fill the ring round once and more (13 rows: cursor 3), then die overwriting rows 3, 4,
    5 after their first leaf."""
    rb = ReplayBuffer(storage=LazyMemmapStorage(CAP, scratch_dir=path, existsok=True))
    rb.extend(rows(range(13)))
    killed.die_after_first_leaf()
    rb.extend(rows([100, 101, 102]))


#: the ids kept, oldest first: rows 6..9 (ids 6..9) move down, then the ring is rotated
KEPT = [6, 7, 8, 9, 10, 11, 12]


def recoverer_dies(killed, path: Path, after: int, stage_rows: int) -> None:
    """Open the storage (which recovers), dying after the ``after``-th event of the recovery
    (a copy into a leaf, a step's sources staged), ``stage_rows`` rows moved a step."""
    real_copy = torch.Tensor.copy_
    real_recover = torn_writes.TornWrites.recover
    real_stage = getattr(torn_writes, "_stage", None)
    events = 0
    recovering = False

    def event() -> None:
        nonlocal events
        events += 1
        if recovering and events >= after:
            killed.die()

    def copy_(self, *args, **kwargs):
        out = real_copy(self, *args, **kwargs)
        if recovering:
            event()
        return out

    def recover(self, layout):
        nonlocal recovering
        recovering = True
        return real_recover(self, layout)

    def stage(*args):
        real_stage(*args)
        event()  # staged, not yet recorded

    torch.Tensor.copy_ = copy_  # type: ignore[method-assign]
    torn_writes.TornWrites.recover = recover  # type: ignore[method-assign]
    if real_stage is not None:
        torn_writes._stage = stage
    torn_writes.STAGE_BYTES = stage_rows * (8 + 8 * 3 + 1 + 4)
    LazyMemmapStorage(CAP, scratch_dir=path, existsok=True)  # recovers in __init__


@pytest.fixture
def torn_template(tmp_path, killed) -> Path:
    template = tmp_path / "template"
    killed.run_killed(writer_dies, killed, template)
    return template


@pytest.mark.parametrize("stage_rows", [1, 7])
def test_recoverer_killed_anywhere_leaves_whole_rows(tmp_path, killed, torn_template,
                                                       stage_rows):
    """Kill the recovering process at its 1st, 2nd, ... event until one finishes: a process
    opening the storage then reads exactly the rows a whole recovery leaves."""
    for after in range(1, 200):
        path = tmp_path / f"kill{after}"
        shutil.copytree(torn_template, path)
        code = killed.run(recoverer_dies, killed, path, after, stage_rows)
        storage = LazyMemmapStorage(CAP, scratch_dir=path, existsok=True)
        assert read_ids(storage) == KEPT, f"recoverer killed after event {after}"
        if code == 0:  # this one finished: every earlier point was a kill
            assert after > 2
            break
    else:
        pytest.fail("the recovery never finished")


def test_recoverers_killed_one_after_another_finish_it(tmp_path, killed, torn_template):
    path = tmp_path / "s"
    shutil.copytree(torn_template, path)
    deaths = 0
    while killed.run(recoverer_dies, killed, path, 10, 1) != 0:  # each dies at its 10th event: a step done
        deaths += 1
        assert deaths < 100, "the recovery never finished"
    assert deaths > 2
    storage = LazyMemmapStorage(CAP, scratch_dir=path, existsok=True)
    assert read_ids(storage) == KEPT
    rb = ReplayBuffer(storage=storage, batch_size=4)
    rb.extend(rows([200, 201, 202, 203]))  # the ring goes on: the free rows, then the oldest
    assert read_ids(storage) == [203, *KEPT[1:], 200, 201, 202]


def test_a_full_disk_during_recovery_raises_and_the_next_lock_finishes_it(
        tmp_path, torn_template, monkeypatch):
    path = tmp_path / "s"
    shutil.copytree(torn_template, path)
    monkeypatch.setattr(torn_writes, "STAGE_BYTES", 1)
    real_stage = torn_writes._stage
    staged = 0

    def full_disk_at_the_third(*args):
        nonlocal staged
        staged += 1
        if staged == 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_stage(*args)

    monkeypatch.setattr(torn_writes, "_stage", full_disk_at_the_third)
    with pytest.raises(OSError) as err:
        LazyMemmapStorage(CAP, scratch_dir=path, existsok=True)
    assert err.value.errno == errno.ENOSPC
    monkeypatch.setattr(torn_writes, "_stage", real_stage)  # room again
    storage = LazyMemmapStorage(CAP, scratch_dir=path, existsok=True)
    assert read_ids(storage) == KEPT
    assert sorted(p.name for p in path.iterdir() if "recovery" in p.name or "staging" in p.name) == []
