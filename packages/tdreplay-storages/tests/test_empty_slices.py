"""An empty slice written into a tensor storage writes nothing (``storage.set(slice(7, 1), empty)``
named a negative shape in its error; ``rb[5:2] = empty`` raised torch's bare ``arange`` error)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage

STORAGES = {"lazy_tensor": lambda: LazyTensorStorage(6), "lazy_memmap": lambda: LazyMemmapStorage(6)}


def rows(*values: float) -> TensorDict:
    return TensorDict({"x": torch.tensor(values)}, [len(values)])


@pytest.mark.parametrize("kind", ["lazy_tensor", "lazy_memmap"])
@pytest.mark.parametrize("index", [slice(5, 2), slice(4, 4), slice(7, 1), slice(7, 1, 2)])
def test_an_empty_slice_writes_nothing(kind, index):
    from tdreplay.core import TensorDictReplayBuffer

    rb = TensorDictReplayBuffer(storage=STORAGES[kind]())
    rb.extend(rows(1.0, 2.0, 3.0, 4.0))
    empty = TensorDict({"x": torch.zeros(0)}, [0])
    rb.storage.set(index, empty)  # (the storage: a negative shape was named in an error)
    if index.stop <= 4:
        rb[index] = empty  # (the buffer: torch.arange refused the bounds)
    assert len(rb) == 4 and rb[:]["x"].tolist() == [1.0, 2.0, 3.0, 4.0]
    assert rb.storage.last_written_row == 3
