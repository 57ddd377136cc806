"""An index assignment (``rb[i] = x``, ``storage[i] = x``) past the written rows raises
``StorageIndexError``: an ``IndexError`` and, as TorchRL's list storages raise, a
``RuntimeError`` (it was a plain ``IndexError``, which ``except RuntimeError:`` written for
TorchRL missed); nothing is written."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ListStorage, ReplayBuffer, StorageIndexError, TensorDictReplayBuffer
from tdreplay.core.testing import assert_same, buffer_snapshot


@pytest.mark.parametrize("index", [5, -9, [0, 5], torch.tensor([7]), slice(4, 6)])
def test_list_buffer_assignment_past_written_rows(index) -> None:
    rb = ReplayBuffer(storage=ListStorage(10))
    rb.extend([1, 2, 3])
    before = buffer_snapshot(rb)
    value = [9, 9] if isinstance(index, (list, slice)) else 9
    with pytest.raises(RuntimeError, match="rows are written|would write past") as info:
        rb[index] = value
    assert isinstance(info.value, StorageIndexError) and isinstance(info.value, IndexError)
    assert_same(buffer_snapshot(rb), before)
    assert rb[:] == [1, 2, 3]


@pytest.mark.filterwarnings("ignore:Using `add\\(\\)` with a TensorDict")
def test_tensordict_items_past_written_rows() -> None:
    rb = TensorDictReplayBuffer(storage=ListStorage(10))
    rb.add(TensorDict({"r": torch.zeros(3)}, [3]))
    with pytest.raises(StorageIndexError, match="1 rows are written"):
        rb[5] = TensorDict({"r": torch.zeros(2)}, [2])
    with pytest.raises(StorageIndexError):
        rb.storage[1] = TensorDict({"r": torch.zeros(2)}, [2])
    assert len(rb) == 1
