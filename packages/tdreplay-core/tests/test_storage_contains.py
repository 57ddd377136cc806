"""Storage.contains and StorageIndexError (TorchRL's RuntimeError for list-storage writes)."""

import pytest
import torch

from tdreplay.core import ListStorage, StorageIndexError


def test_contains_int_negative_and_tensor():
    s = ListStorage(4)
    assert s.contains(0) is False
    s.set(torch.arange(3), ["a", "b", "c"])
    assert [s.contains(i) for i in (0, 2, 3, -1, -3, -4)] == [True, True, False, True, True,
                                                             False]
    mask = s.contains(torch.tensor([[0, 3], [2, -1]]))
    assert mask.dtype == torch.bool and mask.tolist() == [[True, False], [True, False]]
    with pytest.raises(TypeError, match="index"):
        s.contains("0")


def test_list_storage_write_errors_are_index_and_runtime_errors():
    assert issubclass(StorageIndexError, IndexError)
    assert issubclass(StorageIndexError, RuntimeError)
    s = ListStorage(3)
    with pytest.raises(RuntimeError, match="out of range"):
        s.set(7, "x")
    with pytest.raises(IndexError, match="without gaps"):
        s.set(torch.tensor([1]), ["x"])
    assert len(s) == 0
