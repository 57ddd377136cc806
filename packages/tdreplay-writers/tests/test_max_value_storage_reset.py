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


def _saved_storage_state(rewards: list[float]) -> dict:
    source = buffer()
    source.extend(TensorDict({"x": torch.tensor(rewards) + 1000, "reward": torch.tensor(rewards)},
                             [len(rewards)]))
    return source.storage.state_dict()


@pytest.mark.parametrize("how", ["storage", "other buffer"])
def test_a_restore_of_as_many_rows_past_the_writer_ranks_the_restored_rows(how):
    # the heap kept the ranks 10..160 of the rows gone: a row of reward 5 was refused although
    # every restored row (0..15) ranks lower (TorchRL keeps its heap the same way)
    rb = buffer()
    other = TensorDictReplayBuffer(storage=rb.storage)
    rb.extend(data(16, 10))
    state = _saved_storage_state([float(r) for r in range(16)])
    (rb.storage if how == "storage" else other).load_state_dict(
        {**other.state_dict(), "_storage": state} if how == "other buffer" else state)
    assert rb.writer.ranks.tolist() == [float(r) for r in range(16)]
    assert rb.extend(data(1, 5)).tolist() == [0]  # replaces the row of reward 0
    assert sorted(rb[:]["reward"].tolist()) == [1.0, 2.0, 3.0, 4.0, 5.0, 5.0] + \
        [float(r) for r in range(6, 16)]


def test_a_restore_of_more_rows_than_the_writer_ranked_keeps_the_best():
    # the writer ranked 2 rows; the storage came back with 4 (rewards 1..4, full): rows of
    # reward 0.5 and 0.6 replaced the restored rows of reward 3 and 4 (rows 2 and 3)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(4),
                                writer=TensorDictMaxValueWriter(rank_key="reward"))
    rb.extend(data(2, 10))
    source = TensorDictReplayBuffer(storage=LazyTensorStorage(4))
    source.extend(TensorDict({"x": torch.arange(4.0), "reward": torch.arange(1.0, 5.0)}, [4]))
    rb.storage.load_state_dict(source.storage.state_dict())
    assert rb.extend(TensorDict({"x": torch.zeros(2), "reward": torch.tensor([0.5, 0.6])},
                                [2])).tolist() == [-1, -1]  # both below every kept row
    assert rb[:]["reward"].tolist() == [1.0, 2.0, 3.0, 4.0]
    rb.extend(TensorDict({"x": torch.zeros(1), "reward": torch.tensor([3.5])}, [1]))
    assert rb[:]["reward"].tolist() == [3.5, 2.0, 3.0, 4.0]  # (the row of reward 1 went)


def test_restored_rows_whose_ranks_cannot_be_read_rank_lowest():
    rb = buffer()
    rb.extend(data(16, 10))
    rewards = torch.arange(16.0)
    rewards[3] = float("nan")  # (written without a max-value writer, which refuses NaN)
    source = TensorDictReplayBuffer(storage=LazyTensorStorage(16))
    source.extend(TensorDict({"x": torch.arange(16.0), "reward": rewards}, [16]))
    rb.storage.load_state_dict(source.storage.state_dict())
    assert rb.writer.ranks.tolist() == [float("-inf")] * 16
    assert rb.extend(data(1, -50)).tolist() == [0]  # any rank beats an unknown one
