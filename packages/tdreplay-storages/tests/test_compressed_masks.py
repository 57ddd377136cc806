"""A boolean mask reads a ``CompressedListStorage`` as it reads a ``ListStorage`` (the rows it
marks, decompressed into one batch), through ``get`` as through ``storage[mask]``; a mask of
another length is refused naming the argument."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.storages import CompressedListStorage


def _storage() -> CompressedListStorage:
    s = CompressedListStorage(8)
    s.set(range(5), TensorDict(a=torch.arange(5.0), b=torch.arange(10).reshape(5, 2),
                               batch_size=[5]))
    return s


@pytest.mark.parametrize("length", [5, 8], ids=["written", "max_size"])
def test_mask_reads_the_marked_rows(length: int) -> None:
    s = _storage()
    mask = torch.zeros(length, dtype=torch.bool)
    mask[[0, 2, 4]] = True
    got = s.get(mask)
    assert got.batch_size == torch.Size([3])
    assert got["a"].tolist() == [0.0, 2.0, 4.0]
    assert got["b"].dtype == torch.int64 and got["b"].tolist() == [[0, 1], [4, 5], [8, 9]]
    if length == 5:
        assert (s[mask] == got).all()


def test_empty_mask_reads_nothing() -> None:
    assert _storage().get(torch.zeros(5, dtype=torch.bool)) == []


def test_mask_of_another_length_is_refused() -> None:
    s = _storage()
    with pytest.raises(IndexError, match="index is a boolean mask of shape"):
        s.get(torch.tensor([True, False]))
    assert s.get(torch.arange(5))["a"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
