"""A tensor storage is filled without gaps, as a ``ListStorage``: ``storage.set(5, x)`` with 3
rows written counted rows 3 and 4, never written, as data (zeros, sampled); it is refused with
an ``IndexError`` naming the rows, the storage unchanged. A write reaching on from the written
rows (in any order) stays allowed."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ReplayBuffer
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage

MAKERS = {"lazy": lambda: LazyTensorStorage(6), "memmap": lambda: LazyMemmapStorage(6),
          "compilable": lambda: LazyTensorStorage(6, compilable=True)}
GAPS = {"int": (5, torch.tensor(9.0)), "list": ([5], torch.tensor([9.0])),
        "tensor": (torch.tensor([5, 3]), torch.tensor([9.0, 9.0])),
        "slice": (slice(4, 6), torch.tensor([9.0, 9.0])),
        "step": (slice(3, 6, 2), torch.tensor([9.0, 9.0]))}


@pytest.mark.parametrize("make", MAKERS.values(), ids=MAKERS.keys())
@pytest.mark.parametrize("gap", GAPS.values(), ids=GAPS.keys())
@pytest.mark.parametrize("set_cursor", [True, False])
def test_a_write_leaving_a_gap_is_refused_and_changes_nothing(make, gap, set_cursor):
    storage = make()
    rb = ReplayBuffer(storage=storage, batch_size=8)
    rb.extend(torch.arange(1.0, 4.0))
    cursor, data = gap
    with pytest.raises(IndexError, match=r"filled without gaps: cannot write rows \[.*\] while "
                                         r"3 rows are written: rows? [34]"):
        storage.set(cursor, data, set_cursor=set_cursor)
    assert len(storage) == 3 and rb[:].tolist() == [1.0, 2.0, 3.0]
    assert storage.last_written_row == 2
    assert rb.extend(torch.tensor([4.0])).tolist() == [3]  # the writer goes on at row 3


@pytest.mark.parametrize("make", MAKERS.values(), ids=MAKERS.keys())
def test_writes_reaching_on_from_the_written_rows_are_allowed(make):
    storage = make()
    rb = ReplayBuffer(storage=storage)
    rb.extend(torch.arange(1.0, 4.0))
    storage.set(3, torch.tensor(4.0))  # row == len: no gap
    storage.set(torch.tensor([5, 4]), torch.tensor([6.0, 5.0]))  # any order, no gap
    assert rb[:].tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    storage.set(torch.tensor([0, 5]), torch.tensor([0.0, 7.0]))  # full: any rows
    assert rb[:].tolist() == [0.0, 2.0, 3.0, 4.0, 5.0, 7.0]


def test_a_first_write_past_row_zero_is_refused_before_the_layout():
    storage = LazyTensorStorage(12, ndim=2)
    with pytest.raises(IndexError, match=r"rows 0 to 1 would be left unwritten"):
        storage.set(slice(2, 3), TensorDict({"x": torch.zeros(1, 3)}, [1, 3]))
    assert not storage.initialized and len(storage) == 0
    storage.set(slice(0, 1), TensorDict({"x": torch.ones(1, 3)}, [1, 3]))
    assert len(storage) == 3
