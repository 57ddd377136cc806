"""An index of an ``ndim=2`` storage out of range at one of its dims: the ``IndexError``
names the index as given, the dim it is out of range for, its size and the valid indices
there, in the storage's layout (``[rows, inner]``: time-major for a buffer's ``dim_extend=1``),
for reads (``storage[i, j]``, ``get((i, j))``) and writes (``storage[i, j] = x``). A buffer
indexes the storage with its dims swapped (``rb[i, j]``: ``storage[j, i]``): its error names the
storage's index. Nothing is written by a refused write."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ReplayBuffer
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage


def _buffer(tensordict=True, storage=None):
    storage = storage if storage is not None else LazyTensorStorage(12, ndim=2)
    rb = ReplayBuffer(storage=storage)
    data = torch.arange(12.0).reshape(2, 6)  # 2 envs, 6 steps: the storage is [6, 2]
    rb.extend(TensorDict({"x": data}, [2, 6]) if tensordict else data)
    return rb


def _values(rb):
    data = rb.storage[:]
    return (data["x"] if isinstance(data, TensorDict) else data).clone()


@pytest.mark.parametrize("tensordict", [True, False])
@pytest.mark.parametrize(
    "call, match",
    [
        (
            lambda s: s[7, 0],
            r"^storage\[7, 0\]: index 7 is out of range for dim 0 \(size 6\) of "
            r"the storage's layout \[6, 2\] \(dim 0: its 6 written rows\); valid "
            r"indices at dim 0: -6 to 5\.$",
        ),
        (
            lambda s: s[0, 7],
            r"^storage\[0, 7\]: index 7 is out of range for dim 1 \(size 2\) .*"
            r"valid indices at dim 1: -2 to 1\.$",
        ),
        (lambda s: s[0, -3], r"^storage\[0, -3\]: index -3 is out of range for dim 1 \(size 2\)"),
        (
            lambda s: s[:, torch.tensor([1, 4])],
            r"^storage\[:, tensor\(\[1, 4\]\)\]: index 4 is out "
            r"of range for dim 1",
        ),
        (
            lambda s: s.get((0, 9)),
            r"^get\(\(0, 9\)\): index 9 is out of range for dim 1 \(size 2\)",
        ),
        (
            lambda s: s.get((9, 0)),
            r"^get\(\(9, 0\)\): index 9 is out of range for dim 0 \(size 6\)",
        ),
    ],
)
def test_storage_reads(tensordict, call, match):
    storage = _buffer(tensordict).storage
    with pytest.raises(IndexError, match=match) as info:
        call(storage)
    assert info.value.dim in (0, 1) and info.value.size == (6, 2)[info.value.dim]


@pytest.mark.parametrize("tensordict", [True, False])
@pytest.mark.parametrize(
    "index, match",
    [
        ((7, 0), r"^storage\[7, 0\] = \.\.\.: index 7 is out of range for dim 0 \(size 6\)"),
        (
            (0, 5),
            r"^storage\[0, 5\] = \.\.\.: index 5 is out of range for dim 1 \(size 2\) .*"
            r"valid indices at dim 1: -2 to 1\.$",
        ),
        ((slice(None), 9), r"^storage\[:, 9\] = \.\.\.: index 9 is out of range for dim 1"),
    ],
)
def test_storage_writes(tensordict, index, match):
    rb = _buffer(tensordict)
    before = _values(rb)
    value = TensorDict({"x": torch.tensor(-1.0)}, []) if tensordict else torch.tensor(-1.0)
    with pytest.raises(IndexError, match=match):
        rb.storage[index] = value
    assert torch.equal(_values(rb), before) and len(rb) == 12


def test_rows_not_written_are_out_of_range_at_dim_0():
    storage = LazyTensorStorage(12, ndim=2)
    storage.set(slice(0, 3), torch.zeros(3, 2))  # 3 of 6 rows written
    with pytest.raises(
        IndexError,
        match=r"index 4 is out of range for dim 0 \(size 3\) of the "
        r"storage's layout \[3, 2\] \(dim 0: its 3 written",
    ):
        storage[4, 0]
    assert storage[2, 1].item() == 0.0 and storage[-3, -2].item() == 0.0


@pytest.mark.parametrize(
    "index, match",
    [
        ((5, 0), r"^storage\[0, 5\]: index 5 is out of range for dim 1 \(size 2\)"),
        ((0, 7), r"^storage\[7, 0\]: index 7 is out of range for dim 0 \(size 6\)"),
    ],
)
def test_buffer_reads_and_writes_name_the_storage_index(index, match):
    rb = _buffer()
    before = _values(rb)
    with pytest.raises(IndexError, match=match):
        rb[index]
    with pytest.raises(IndexError, match=match):
        rb[index] = TensorDict({"x": torch.tensor(-1.0)}, [])
    with pytest.raises(IndexError, match=r"^storage\[9, :\]: index 9 is out of range for dim 0"):
        rb[:, 9] = TensorDict({"x": torch.full((2,), -1.0)}, [2])
    assert torch.equal(_values(rb), before)


def test_memmap_storage():
    rb = _buffer(storage=LazyMemmapStorage(12, ndim=2))
    before = _values(rb)
    with pytest.raises(IndexError, match=r"^storage\[0, 2\]: index 2 is out of range for dim 1"):
        rb.storage[0, 2]
    with pytest.raises(IndexError, match=r"^storage\[6, 0\] = \.\.\.: index 6 is out of range"):
        rb.storage[6, 0] = TensorDict({"x": torch.tensor(-1.0)}, [])
    assert torch.equal(_values(rb), before)


def test_in_range_indices_still_read_and_write():
    rb = _buffer(tensordict=False)
    rb.storage[5, 1] = torch.tensor(50.0)
    assert rb.storage[5, 1].item() == 50.0 and rb.storage.get((5, 1)).item() == 50.0
    assert rb[1, 5].item() == 50.0 and rb.storage[-1, -1].item() == 50.0
