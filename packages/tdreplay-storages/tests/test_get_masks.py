"""``storage.get`` of a boolean mask selects the slots it marks, as TorchRL's does (it read the
mask's 0/1 values as slots: ``get([True, False, True, False])`` returned rows 1, 0, 1, 0); a
float tensor is refused naming ``slots`` (it failed in numpy's cast)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage

STORAGES = {"lazy": lambda: LazyTensorStorage(6), "memmap": lambda: LazyMemmapStorage(6)}


@pytest.mark.parametrize("make", STORAGES.values(), ids=STORAGES.keys())
def test_a_mask_selects_the_slots_it_marks(make):
    storage = make()
    storage.set(torch.arange(4), TensorDict({"x": torch.arange(4.0) * 10}, [4]))
    mask = torch.tensor([True, False, True, False])
    assert storage.get(mask)["x"].tolist() == [0.0, 20.0]  # TorchRL 0.14.1: [0., 20.]
    over_capacity = torch.tensor([False, True, False, True, False, False])
    assert storage.get(over_capacity)["x"].tolist() == [10.0, 30.0]
    with pytest.raises(IndexError):  # a mask marking a slot never written
        storage.get(torch.tensor([False, False, False, False, True, False]))
    assert storage.get(torch.tensor([1, 3], dtype=torch.int32))["x"].tolist() == [10.0, 30.0]
    with pytest.raises(TypeError, match="index must hold integers"):
        storage.get(torch.tensor([0.5]))


def test_a_mask_of_a_two_dimensional_storage_marks_flat_slots():
    storage = LazyTensorStorage(4, ndim=2)
    storage.set(torch.arange(2), TensorDict({"x": torch.arange(4.0).reshape(2, 2)}, [2, 2]))
    mask = torch.tensor([[True, False], [False, True]])
    assert storage.get(mask)["x"].tolist() == [0.0, 3.0]
