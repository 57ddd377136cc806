"""A LazyMemmapStorage whose writer died in the middle of a write never counts a torn row."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ReplayBuffer
from tdreplay.storages import LazyMemmapStorage
from tdreplay.storages._layout import TensorLayout

CAP = 10


def rows(start: int, n: int) -> TensorDict:
    ids = torch.arange(start, start + n)
    return TensorDict({"a": ids.double().unsqueeze(-1).expand(n, 4).clone(), "id": ids,
                       "z": (-ids).float().unsqueeze(-1).expand(n, 4).clone()}, [n])


def ids_of(storage: LazyMemmapStorage) -> list[int]:
    n = len(storage)
    if not n:
        return []
    td = storage[:n]
    whole = (td["a"] == td["id"].double().unsqueeze(-1)).all(-1) \
        & (td["z"] == (-td["id"]).float().unsqueeze(-1)).all(-1)
    assert bool(whole.all()), f"torn rows counted: {td['id'][~whole].tolist()}"
    return td["id"].tolist()


def buffer(path) -> ReplayBuffer:
    return ReplayBuffer(storage=LazyMemmapStorage(CAP, scratch_dir=path, existsok=True),
                        batch_size=2)


def written_in_fours(path, written: int) -> ReplayBuffer:
    """A buffer of ``path`` with rows ``0 .. written - 1`` written 4 at a time."""
    rb = buffer(path)
    for start in range(0, written, 4):
        rb.extend(rows(start, min(4, written - start)))
    return rb


def die_in_the_middle(killed, path, written: int, n: int, how: str | int) -> None:
    """Write ``written`` rows, then die (SIGKILL) after the first leaf of the next write."""
    rb = written_in_fours(path, written)
    killed.die_after_first_leaf()  # (a forked child: the patches die with it)
    if how == "extend":
        rb.extend(rows(1000, n))
    else:
        rb.storage.set(how, rows(1000, 1)[0])


def run_and_kill(killed, path, written: int, n: int, how: str | int = "extend") -> None:
    killed.run_killed(die_in_the_middle, killed, path, written, n, how)


@pytest.mark.parametrize("written, n, expected", [
    (6, 3, list(range(6))),  # a first write: its rows were never counted
    (8, 4, list(range(8))),  # the first write past the end: 8, 9 uncounted, wraps to 0, 1
    # a full ring, overwriting rows 2-4 (oldest first: 5..9, then 0, 1)
    (12, 3, [5, 6, 7, 8, 9, 10, 11]),
    # a full ring, the write wraps: rows 8, 9, 0 torn; survivors 1..7 = ids 11, 2..7
    (18, 3, [11, 12, 13, 14, 15, 16, 17]),
])
def test_killed_extend_leaves_no_torn_row(tmp_path, killed, written, n, expected):
    if written == 8:  # 8 rows + 4: rows 8, 9 new, then 0, 1 overwritten
        expected = [2, 3, 4, 5, 6, 7]
    run_and_kill(killed, tmp_path, written, n)
    rb = buffer(tmp_path)
    assert ids_of(rb.storage) == expected
    # the ring goes on: the next rows fill the dropped places, oldest evicted first
    rb.extend(rows(2000, CAP - len(rb) + 1))
    got = ids_of(rb.storage)
    assert len(got) == CAP and got.count(2000) == 1 and expected[0] not in got
    assert sorted(got) == sorted(expected[1:] + list(range(2000, 2000 + CAP - len(expected) + 1)))


def test_killed_in_place_edit_drops_only_that_row(tmp_path, killed):
    run_and_kill(killed, tmp_path, 7, 1, how=4)
    rb = buffer(tmp_path)
    assert ids_of(rb.storage) == [0, 1, 2, 3, 5, 6]


def test_a_live_reader_drops_the_torn_rows_before_reading(tmp_path, killed):
    reader = buffer(tmp_path)
    reader.extend(rows(0, 4))
    run_and_kill(killed, tmp_path, 0, 1, how=4)  # a first write of row 4: never counted
    assert ids_of(reader.storage) == [0, 1, 2, 3]
    run_and_kill(killed, tmp_path, 0, 1, how=1)  # an overwrite of row 1: dropped by the next reader
    assert ids_of(reader.storage) == [0, 2, 3]
    run_and_kill(killed, tmp_path, 0, 2)  # a first write of 2 rows (at the cursor, 3): never counted
    assert ids_of(reader.storage) == [0, 2, 3]
    reader.extend(rows(50, 1))
    assert ids_of(reader.storage) == [0, 2, 3, 50]


def test_refused_overwrite_changes_nothing(tmp_path):
    rb = buffer(tmp_path)
    rb.extend(rows(0, CAP))
    with pytest.raises((KeyError, ValueError)):
        rb.storage.set(slice(0, 2), TensorDict({"a": torch.zeros(2, 4)}, [2]))
    assert ids_of(rb.storage) == list(range(CAP))
    assert not rb.storage._torn.pending
    rb.extend(rows(100, 2))
    assert ids_of(rb.storage)[:2] == [100, 101]


def test_interrupted_overwrite_in_process_drops_the_rows(tmp_path, monkeypatch):
    rb = buffer(tmp_path)
    rb.extend(rows(0, CAP))

    def interrupted(self, start, stop, src, shapes=None):
        self.leaves[0][start:stop].copy_(src[0])
        raise KeyboardInterrupt

    monkeypatch.setattr(TensorLayout, "copy_rows", interrupted)
    with pytest.raises(KeyboardInterrupt):
        rb.extend(rows(100, 3))
    monkeypatch.undo()
    assert ids_of(rb.storage) == list(range(3, CAP))


def assign_and_die(killed, path, index) -> None:
    rb = buffer(path)
    rb.extend(rows(0, 7))
    killed.die_after_first_leaf()  # (a forked child: the patches die with it)
    n = len(range(7)[index]) if isinstance(index, slice) else \
        (1 if isinstance(index, int) else len(index))
    value = rows(1000, n) if not isinstance(index, int) else rows(1000, 1)[0]
    rb[index] = value


@pytest.mark.parametrize("index", [3, torch.tensor([1, 4]), slice(2, 5), [5, 0]])
def test_killed_item_assignment_leaves_the_rows_as_before(tmp_path, killed, index):
    # rb[i] = x of counted rows is journaled: the rows come back whole and old, none is
    # dropped (before: they were dropped and the rows after them moved down)
    killed.run_killed(assign_and_die, killed, tmp_path, index)
    rb = buffer(tmp_path)
    assert ids_of(rb.storage) == list(range(7))
    assert rb.write_count == 7 and rb.writer.cursor == 7
    rb[index] = rows(2000, 3)[0] if isinstance(index, int) else \
        rows(2000, len(range(7)[index]) if isinstance(index, slice) else len(index))
    assert len(rb) == 7  # an assignment that completes writes in place


def extend_and_die_after_the_write(killed, path, written: int, n: int) -> None:
    rb = written_in_fours(path, written)
    real_set = LazyMemmapStorage.set

    def set_then_die(self, *args, **kwargs):  # the rows are copied; the counters not moved
        real_set(self, *args, **kwargs)
        killed.die()

    LazyMemmapStorage.set = set_then_die  # type: ignore[method-assign]
    rb.extend(rows(1000, n))


@pytest.mark.parametrize("written, n, expected", [
    (5, 3, [0, 1, 2, 3, 4]),  # a first write past the count: not counted
    (CAP, 3, [3, 4, 5, 6, 7, 8, 9]),  # a full ring: the rows it overwrote are dropped
])
def test_killed_between_the_write_and_the_counters_leaves_counters_and_rows_agreeing(
        tmp_path, killed, written, n, expected):
    # before: the new rows stayed visible with the writer's cursor and write count not
    # moved (a full ring then evicted its newest rows first; a ring not full counted rows
    # its next extend overwrote)
    killed.run_killed(extend_and_die_after_the_write, killed, tmp_path, written, n)
    rb = buffer(tmp_path)
    assert ids_of(rb.storage) == expected
    assert rb.writer.cursor == len(expected) % CAP
    rb.extend(rows(2000, 2))
    got = ids_of(rb.storage)
    assert got[len(expected):len(expected) + 2] == [2000, 2001] or got[:2] == [2000, 2001]
    assert set(expected[:len(expected) + 2 - CAP]).isdisjoint(got) if len(expected) + 2 > CAP \
        else got == expected + [2000, 2001]


def test_dropping_torn_rows_counts_as_a_reset_for_the_other_processes(tmp_path, killed):
    # the survivors move down over the torn rows: a process keeping something per row (a
    # sync=False learner's priority trees) must start afresh, as after an empty(); it kept its
    # trees and every sample raised "the sampler drew slot 9, but the storage holds 7"
    rb = written_in_fours(tmp_path, 12)
    before = rb.storage.shared_reset_count()
    killed.run_killed(die_in_the_middle, killed, tmp_path, 12, 3, "extend")
    assert ids_of(rb.storage) == [5, 6, 7, 8, 9, 10, 11]  # (this process ran the recovery)
    assert rb.storage.shared_reset_count() != before
    settled = rb.storage.shared_reset_count()
    rb.extend(rows(3000, 2))  # a write that returns is no reset
    assert rb.storage.shared_reset_count() == settled
