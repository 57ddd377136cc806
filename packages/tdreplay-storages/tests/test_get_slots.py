"""``storage.get`` reads written slots as TorchRL's: negative slots count from the last written
one (``get(-1)`` was refused by every storage; TorchRL returns the last slot of a full storage),
and a boolean mask must have one entry per written slot (a mask of another length was read as
its ``nonzero()`` by ``CompressedListStorage`` and ``TensorStorage.get``)."""

from __future__ import annotations

import pytest
import torch

from tdreplay.core import ListStorage, ReplayBuffer
from tdreplay.storages import (
    CompressedListStorage,
    LazyMemmapStorage,
    LazyStackStorage,
    LazyTensorStorage,
)

STORAGES = {
    "tensor": lambda: LazyTensorStorage(4),
    "memmap": lambda: LazyMemmapStorage(4),
    "list": lambda: ListStorage(4),
    "stack": lambda: LazyStackStorage(4),
    "compressed": lambda: CompressedListStorage(4),
}


def _values(read) -> list[int]:
    if isinstance(read, list):
        return [int(x) for x in read]
    return [int(x) for x in torch.as_tensor(read).reshape(-1)]


@pytest.mark.parametrize("kind", sorted(STORAGES))
@pytest.mark.parametrize("written", [3, 6])  # partly filled, and wrapped
def test_negative_slots_count_from_the_last_written_slot(kind, written):
    rb = ReplayBuffer(storage=STORAGES[kind]())
    rb.extend([torch.tensor(i) for i in range(written)] if kind in ("list", "stack")
              else torch.arange(written))
    storage, n = rb.storage, len(rb)
    every = _values(storage.get(torch.arange(n)))
    assert _values(storage.get(-1)) == every[-1:]
    assert _values(storage.get([-1, 0, -n])) == [every[-1], every[0], every[0]]
    assert _values(storage.get(torch.tensor([-2]))) == every[-2:-1]
    with pytest.raises(IndexError):
        storage.get(-n - 1)
    with pytest.raises(IndexError):
        storage.get([n])


@pytest.mark.parametrize("kind", ["tensor", "memmap", "compressed"])
def test_a_mask_of_another_length_than_the_written_slots_is_refused(kind):
    rb = ReplayBuffer(storage=STORAGES[kind]())
    rb.extend(torch.arange(3))
    storage = rb.storage
    with pytest.raises(IndexError, match=r"one entry per written slot \(3\).*got shape \(2,\)"):
        storage[torch.tensor([True, False])] if kind == "compressed" \
            else storage.get(torch.tensor([True, False]))
    assert _values(rb[torch.tensor([False, True, True])]) == [1, 2]
    assert _values(rb[:]) == [0, 1, 2]  # (nothing changed)


@pytest.mark.parametrize("kind", ["tensor", "memmap"])
def test_a_capacity_too_large_to_allocate_names_max_size_and_changes_nothing(kind):
    # (torch's "Maximum allowed dimension exceeded" / "Python int too large to convert to C
    # long" named neither max_size nor the entry)
    storage = (LazyTensorStorage if kind == "tensor" else LazyMemmapStorage)(2**62)
    rb = ReplayBuffer(storage=storage)
    with pytest.raises(MemoryError, match=r"\(max_size=4611686018427387904\): cannot allocate "
                                          r"entry '_tensor' of shape"):
        rb.extend(torch.arange(3.0))
    assert len(rb) == 0 and rb.write_count == 0
