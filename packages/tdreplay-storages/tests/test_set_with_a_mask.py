"""``storage.set(mask, data)`` on a tensor storage writes the rows a boolean mask marks (one
entry per written row, or per row of the capacity marking written rows), as ``get(mask)``
reads them and as TorchRL's does; it was refused (``TypeError``)."""

from __future__ import annotations

import pytest
import torch

from tdreplay.core import ReplayBuffer
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage


@pytest.mark.parametrize("make", [LazyTensorStorage, LazyMemmapStorage])
def test_the_marked_rows_are_written(make):
    rb = ReplayBuffer(storage=make(6))
    rb.extend(torch.zeros(4, 2))
    storage = rb.storage
    storage.set(torch.tensor([True, False, True, False]), torch.ones(2, 2))
    storage.set(torch.tensor([False, True, False, False, False, False]), torch.full((1, 2), 7.0))
    assert storage.get(slice(None))[:, 0].tolist() == [1.0, 7.0, 1.0, 0.0]
    assert len(storage) == 4


def test_a_mask_of_unwritten_rows_or_of_another_length_is_refused():
    rb = ReplayBuffer(storage=LazyTensorStorage(6))
    rb.extend(torch.zeros(4, 2))
    with pytest.raises(IndexError, match="boolean index"):
        rb.storage.set(torch.tensor([True, False]), torch.ones(1, 2))
    with pytest.raises(IndexError):
        rb.storage.set(torch.tensor([False] * 5 + [True]), torch.ones(1, 2))  # unwritten row
    assert (rb[:] == 0).all() and len(rb) == 4
