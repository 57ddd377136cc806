"""A ``TensorDictMaxValueWriter`` whose storage was emptied or restored with fewer rows past it
(``rb.storage.empty()``, ``rb.storage.load_state_dict``): it went on ranking the rows gone, so
its next write landed after them and the emptied rows came back (``len`` 16 after 5 writes),
and its state fit no storage state. It now keeps only the rows the storage holds."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.storages import LazyTensorStorage
from tdreplay.writers import TensorDictMaxValueWriter


def data(n: int, start: int = 0) -> TensorDict:
    t = torch.arange(start, start + n, dtype=torch.float32)
    return TensorDict({"x": t, "reward": t}, [n])


def buffer() -> TensorDictReplayBuffer:
    return TensorDictReplayBuffer(storage=LazyTensorStorage(16), batch_size=4,
                                  writer=TensorDictMaxValueWriter(rank_key="reward"))


def test_writes_after_an_empty_past_the_buffer_fill_from_row_0():
    rb = buffer()
    rb.extend(data(12))
    rb.storage.empty()
    assert rb.extend(data(5, 200)).tolist() == [0, 1, 2, 3, 4]
    assert len(rb) == 5 and rb[:]["x"].tolist() == [200.0, 201.0, 202.0, 203.0, 204.0]
    restored = buffer()
    restored.load_state_dict(rb.state_dict())  # (it was refused: "ranks 12 rows")
    assert restored[:]["x"].tolist() == rb[:]["x"].tolist()


@pytest.mark.parametrize("save", [False, True])
def test_rows_restored_past_the_writer_are_kept_and_replaced_first(save):
    rb = buffer()
    rb.extend(data(12))
    source = buffer()
    source.extend(data(3, 100))
    rb.storage.load_state_dict(source.storage.state_dict())
    if save:  # (a save after the reset: the writer's state fits the storage's)
        restored = buffer()
        restored.load_state_dict(rb.state_dict())
        rb = restored
    assert rb.extend(data(13, 300)).tolist() == list(range(3, 16))  # free rows first
    assert len(rb) == 16
    rb.extend(data(2, 500))  # full: the restored rows (ranked lowest) go first
    assert sorted(rb[:]["x"].tolist())[:2] == [102.0, 300.0]
