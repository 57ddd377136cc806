"""``storage.get`` reads a tuple as coordinates in the storage's dims, as ``storage[index]`` and
TorchRL's ``get`` do (``get((0, 1))`` of an ``ndim=2`` storage read flat slots 0 and 1, a tuple
of tensors raised a ``TypeError`` about ints, ``get((1,))`` gave a batch of one), and refuses
a ``uint8`` index as ``storage[index]`` does (it read its values as slots)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ReplayBuffer, TensorDictReplayBuffer
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage

MAKERS = {"lazy": LazyTensorStorage, "memmap": LazyMemmapStorage}


@pytest.mark.parametrize("make", MAKERS.values(), ids=MAKERS.keys())
def test_a_tuple_reads_coordinates_of_a_two_dim_storage(make):
    storage = make(12, ndim=2)
    rb = TensorDictReplayBuffer(storage=storage)
    rb.extend(TensorDict({"x": torch.arange(6.0).reshape(3, 2)}, [3, 2]))
    assert storage.get((0, 1))["x"].item() == storage[0, 1]["x"].item() == 2.0  # TorchRL: 2.0
    assert storage.get((0, 1)).batch_size == ()
    assert storage.get((-1, -1))["x"].item() == 5.0  # the last written row, last column
    both = storage.get((torch.tensor([0, 1]), torch.tensor([1, 0])))
    assert both["x"].tolist() == [2.0, 1.0]
    assert storage.get((1,))["x"].tolist() == [1.0, 3.0, 5.0]  # row 1, as storage[1]
    out = storage.get((0, 1))
    out["x"] += 100  # a copy, as get's reads of slots
    assert storage[0, 1]["x"].item() == 2.0
    with pytest.raises(IndexError):
        storage.get((5, 0))  # row 5 is not written
    with pytest.raises(TypeError, match="index must hold int rows or be a bool mask"):
        storage.get((np.array([0.5]), np.array([0])))


@pytest.mark.parametrize("make", MAKERS.values(), ids=MAKERS.keys())
def test_a_tuple_on_a_one_dim_storage_reads_as_its_index(make):
    storage = make(5)
    rb = ReplayBuffer(storage=storage)
    rb.extend(torch.arange(4.0) * 10)
    assert storage.get((1,)).item() == 10.0 and storage.get((1,)).shape == ()  # TorchRL: item
    with pytest.raises(IndexError):  # as storage[(0, 1)] (and TorchRL's)
        storage.get((0, 1))
    with pytest.raises(IndexError):
        storage[(0, 1)]


@pytest.mark.parametrize("make", MAKERS.values(), ids=MAKERS.keys())
@pytest.mark.parametrize("index", [torch.tensor([1, 0, 1, 1], dtype=torch.uint8),
                                   np.array([1, 0, 1, 1], dtype=np.uint8)],
                         ids=["torch", "numpy"])
def test_get_refuses_a_uint8_index_as_reads_and_writes_do(make, index):
    storage = make(5)
    rb = ReplayBuffer(storage=storage)
    rb.extend(torch.arange(4.0) * 10)
    with pytest.raises(TypeError, match="index must hold int rows or be a bool mask, got uint8"):
        storage.get(index)
    with pytest.raises(TypeError, match="index must hold int rows or be a bool mask"):
        storage[index]
    assert storage.get(torch.tensor([True, False, True, True])).tolist() == [0.0, 20.0, 30.0]
