"""RowGather: numpy's row take where it is faster, torch's index_select elsewhere, the same
rows, dtypes and shapes either way."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ReplayBuffer
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage
from tdreplay.storages._row_gather import PARALLEL_GRAIN, RowGather

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.uint8, torch.bool,
          torch.complex64]


def _leaf(dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    values = torch.arange(int(np.prod(shape))).reshape(shape)
    return (values % 2).to(dtype) if dtype is torch.bool else values.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_take_equals_index_select(dtype):
    leaves = [_leaf(dtype, (50, 3, 2)), _leaf(dtype, (50,))]
    slots = torch.tensor([49, 0, 7, 7, 13])
    got = RowGather(leaves).take(slots)
    for leaf, rows in zip(leaves, got):
        assert rows.dtype is leaf.dtype and rows.shape == (5, *leaf.shape[1:])
        assert torch.equal(rows, torch.index_select(leaf, 0, slots))
        assert rows.is_contiguous()


def test_numpy_takes_the_leaves_it_can_see_and_torch_the_others():
    gather = RowGather([torch.zeros(4, 2), torch.zeros(4, dtype=torch.bfloat16),
                        torch.zeros(4, requires_grad=True)])
    assert [host is not None for host in gather.host] == [True, False, False]
    assert gather.row_numel == [2, 1, 1]


@pytest.mark.parametrize("threads", [1, 4])
def test_leaves_numpy_cannot_see_mixed_with_those_it_can(monkeypatch, threads):
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    leaves = [_leaf(torch.float32, (30, 2)), _leaf(torch.bfloat16, (30,)),
              _leaf(torch.int64, (30, 3))]
    gather = RowGather(leaves)
    assert gather.all_views is None  # the bfloat16 leaf: not every leaf has a view
    slots = torch.tensor([29, 0, 3, 3])
    for leaf, rows in zip(leaves, gather.take(slots)):
        assert rows.dtype is leaf.dtype and torch.equal(rows, leaf[slots])


def test_rows_are_copies_that_own_their_memory():
    leaf = torch.arange(10.0).reshape(5, 2)
    rows = RowGather([leaf]).take(torch.tensor([1, 3]))[0]
    rows += 100
    assert leaf[1].tolist() == [2.0, 3.0]  # the storage's row is untouched
    assert rows.tolist() == [[102.0, 103.0], [106.0, 107.0]]


def test_large_gathers_on_several_threads_stay_with_index_select(monkeypatch):
    # above torch's grain on several threads, index_select (parallel) gathers; the same rows
    leaf = _leaf(torch.float32, (PARALLEL_GRAIN, 2))
    slots = torch.randint(0, PARALLEL_GRAIN, (PARALLEL_GRAIN // 2,))
    calls = []
    real_index_select = torch.index_select
    monkeypatch.setattr(torch, "index_select",
                        lambda *a, **k: calls.append(1) or real_index_select(*a, **k))
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    rows = RowGather([leaf]).take(slots)[0]
    assert calls == [1] and torch.equal(rows, leaf[slots])
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    rows = RowGather([leaf]).take(slots)[0]
    assert calls == [1] and torch.equal(rows, leaf[slots])  # numpy's take, no index_select


@pytest.mark.parametrize("storage", ["tensor", "memmap"])
def test_buffers_sample_the_stored_rows(storage, tmp_path):
    make = (LazyTensorStorage(20) if storage == "tensor"
            else LazyMemmapStorage(20, scratch_dir=tmp_path))
    rb = ReplayBuffer(storage=make)
    data = TensorDict({"x": torch.arange(20.0), "n": {"m": torch.arange(40).reshape(20, 2)},
                       "done": torch.arange(20) % 3 == 0}, [20])
    rb.extend(data)
    slots = torch.tensor([[19, 0], [5, 5]])
    got = rb.storage.get(slots)
    assert got.batch_size == (2, 2)
    assert got["x"].tolist() == [[19.0, 0.0], [5.0, 5.0]]
    assert got["n", "m"].tolist() == [[[38, 39], [0, 1]], [[10, 11], [10, 11]]]
    assert got["done"].dtype is torch.bool and got["done"].tolist() == [[False, True],
                                                                         [False, False]]
    sample = rb.sample(64)
    assert torch.equal(sample["n", "m"][:, 0], 2 * sample["x"].long())
    assert torch.equal(sample["done"], sample["x"].long() % 3 == 0)


def test_two_dim_storage_gathers_flat_slots():
    storage = LazyTensorStorage(12, ndim=2)
    rb = ReplayBuffer(storage=storage)
    slots = rb.extend(TensorDict({"x": torch.arange(12.0).reshape(4, 3)}, [4, 3]))
    # each item comes back from the flat slot extend reported for it
    assert storage.get(slots)["x"].tolist() == torch.arange(12.0).reshape(4, 3).tolist()
    assert storage.get(slots[2, 1].reshape(1))["x"].tolist() == [7.0]


def test_a_leaf_whose_memory_moves_is_read_where_it_now_is():
    leaf = torch.arange(8.0).reshape(4, 2)
    gather = RowGather([leaf])
    assert gather.take(torch.tensor([1]))[0].tolist() == [[2.0, 3.0]]
    old_pointer = leaf.data_ptr()
    leaf.share_memory_()  # torch moves the memory (as when the tensor goes to a process)
    assert leaf.data_ptr() != old_pointer
    leaf[1] = torch.tensor([-1.0, -2.0])
    assert gather.take(torch.tensor([1, 3]))[0].tolist() == [[-1.0, -2.0], [6.0, 7.0]]
    assert gather.pointers == [leaf.data_ptr()]
