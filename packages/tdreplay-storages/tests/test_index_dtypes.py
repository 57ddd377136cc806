"""A tensor storage refuses index tensors and arrays of floats or ``uint8``, reading and
writing alike: a read took ``np.array([1.7])`` for row 1 (a write refused it), and a ``uint8``
index was read as a mask (torch's deprecated rule) but written as rows, so ``rb[idx] = x``
wrote other rows than ``rb[idx]`` read."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage

BAD = [torch.tensor([0, 1, 0, 0], dtype=torch.uint8), np.array([1, 0, 0, 0], dtype=np.uint8),
       np.array([1.7]), torch.tensor([1.0])]


@pytest.mark.parametrize("make", [LazyTensorStorage, LazyMemmapStorage])
@pytest.mark.parametrize("index", BAD, ids=["torch_uint8", "numpy_uint8", "numpy_float",
                                            "torch_float"])
def test_float_and_uint8_indices_are_refused_both_ways(make, index):
    rb = TensorDictReplayBuffer(storage=make(4))
    rb.extend(TensorDict({"v": torch.arange(4)}, [4]))
    with pytest.raises(TypeError, match="index must hold int rows or be a bool mask"):
        rb[index]
    with pytest.raises(TypeError, match="index must hold"):  # (the buffer's check or ours)
        rb[index] = TensorDict({"v": torch.full((4,), 9)}, [4])
    assert rb[:]["v"].tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("index", [torch.tensor([True, False, True, False]),
                                   np.array([2, 0]), torch.tensor([2, 0], dtype=torch.int32)])
def test_masks_and_int_rows_read_and_write_the_same_rows(index):
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(4))
    rb.extend(TensorDict({"v": torch.arange(4)}, [4]))
    read = rb[index]["v"].tolist()
    rb[index] = TensorDict({"v": torch.tensor([8, 9])}, [2])
    assert rb[index]["v"].tolist() == [8, 9] and sorted(read) == [0, 2]


def test_tuple_parts_of_a_multi_dim_index_are_checked_and_empty_indices_pass():
    """A float or uint8 part of a tuple index of an ``ndim=2`` storage was read as rows
    (truncated) or as a mask; an empty float array (numpy's default dtype) selects nothing."""
    storage = LazyTensorStorage(30, ndim=2)
    storage.set(torch.arange(4), TensorDict({"a": torch.arange(12.0).reshape(4, 3)}, [4, 3]))
    for index in [(np.array([1.7]), np.array([0])),
                  (torch.tensor([0, 1, 2, 3], dtype=torch.uint8), torch.tensor([0, 0, 0]))]:
        with pytest.raises(TypeError, match="index must hold int rows or be a bool mask"):
            storage[index]
    with pytest.raises(TypeError, match="index must hold int rows or be a bool mask"):
        storage.set(torch.tensor([0], dtype=torch.uint8), TensorDict({"a": torch.ones(1, 3)},
                                                                      [1, 3]))
    assert storage[(np.array([1]), np.array([0]))]["a"].tolist() == [3.0]
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(4))
    rb.extend(TensorDict({"v": torch.arange(4)}, [4]))
    assert rb[np.array([])].batch_size == (0,)
