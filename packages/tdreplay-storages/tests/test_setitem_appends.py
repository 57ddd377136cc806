"""An index assignment past the written rows (``rb[a:b] = x``, ``write_all``) appends rows;
the round-robin writer goes on after them (0.6.2 left its cursor before them, so the next
``extend`` overwrote the rows just appended while the storage had free rows)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ListStorage, ReplayBuffer, TensorDictReplayBuffer
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage


def _td(n: int, start: int = 0) -> TensorDict:
    return TensorDict({"a": torch.arange(start, start + n).float()}, [n])


@pytest.mark.parametrize("make", [LazyTensorStorage, LazyMemmapStorage])
def test_rows_appended_by_a_slice_are_kept_by_the_next_extend(make):
    rb = TensorDictReplayBuffer(storage=make(10))
    rb.extend(_td(6))
    rb[6:8] = _td(2, 50)
    assert (rb.writer.cursor, rb.write_count, len(rb)) == (8, 6, 8)  # (add / extend only)
    assert rb.extend(_td(1, 100)).tolist() == [8]
    assert rb[:]["a"].tolist() == [0, 1, 2, 3, 4, 5, 50, 51, 100]
    rb.extend(_td(3, 200))  # wraps around as usual: rows 9, 0, 1
    assert rb[:]["a"].tolist() == [201, 202, 2, 3, 4, 5, 50, 51, 100, 200]


def test_write_all_past_the_written_rows():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10))
    rb.extend(_td(1))
    rb.write_all(_td(5, 10))
    rb.extend(_td(2, 100))
    assert rb[:]["a"].tolist() == [10, 11, 12, 13, 14, 100, 101]
    assert rb.write_count == 3


def test_a_list_storage_too():
    rb = ReplayBuffer(storage=ListStorage(6))
    rb.extend([0, 1])
    rb[2:5] = [2, 3, 4]
    assert rb.extend([5, 6]).tolist() == [5, 0]
    assert rb[:] == [6, 1, 2, 3, 4, 5]


def test_rewrites_within_the_written_rows_leave_the_writer():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10))
    rb.extend(_td(6))
    rb[2:4] = _td(2, 50)
    assert (rb.writer.cursor, rb.write_count) == (6, 6)


def test_a_slice_without_a_stop_takes_the_rows_of_the_value_as_a_list():
    # rb[n:] = items appends them, as list[n:] = items and TorchRL's list storages do; the
    # buffer resolved the open end against the written rows and refused ("3 items for 0 rows")
    # while storage.set(slice(n, None), items) appended
    rb = ReplayBuffer(storage=ListStorage(10))
    rb.extend([0, 1, 2, 3])
    rb[4:] = [4, 5, 6]
    assert (rb[:], len(rb)) == ([0, 1, 2, 3, 4, 5, 6], 7)
    assert rb.extend([7]).tolist() == [7]  # the writer goes on after them
    rb[6:] = [60, 70, 80]  # rewrites two rows, appends one
    assert rb[:] == [0, 1, 2, 3, 4, 5, 60, 70, 80]
    rb.storage[-2:] = [700, 800]  # the storage itself, as the buffer
    assert rb.storage[:] == [0, 1, 2, 3, 4, 5, 60, 700, 800]


@pytest.mark.parametrize("make", [LazyTensorStorage, LazyMemmapStorage])
def test_a_slice_without_a_stop_appends_to_a_tensor_storage(make, tmp_path):
    storage = make(10, scratch_dir=tmp_path) if make is LazyMemmapStorage else make(10)
    rb = TensorDictReplayBuffer(storage=storage)
    rb.extend(_td(4))
    rb[2:] = _td(4, 10)
    assert rb[:]["a"].tolist() == [0, 1, 10, 11, 12, 13]
    assert rb.extend(_td(1, 99)).tolist() == [6]


@pytest.mark.parametrize("value, message", [([1], "1 items for 2 rows"),
                                            (list(range(9)), "9 items for 6 rows")])
def test_a_slice_without_a_stop_refuses_too_few_or_too_many_items(value, message):
    rb = ReplayBuffer(storage=ListStorage(8))
    rb.extend([0, 1, 2, 3])
    with pytest.raises(ValueError, match=message):  # fewer than it covers; past max_size
        rb[2:] = value
    assert rb[:] == [0, 1, 2, 3]
    assert rb.extend([4]).tolist() == [4]
