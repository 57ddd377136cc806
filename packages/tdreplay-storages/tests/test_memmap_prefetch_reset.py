"""A prefetching buffer over a storage shared between processes drops the batches it drew
ahead when another process empties or restores the storage: their rows are gone (before, the
next ``prefetch`` samples handed out rows removed before they were called)."""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage


def era(n: int, value: int) -> TensorDict:
    return TensorDict({"era": torch.full((n,), value, dtype=torch.long)}, [n])


def _empty_and_refill(rb) -> None:
    rb.empty()
    rb.extend(era(20, 1))


def _restore_other_rows(rb) -> None:
    other = TensorDictReplayBuffer(storage=LazyTensorStorage(64))
    other.extend(era(20, 1))
    rb.storage.load_state_dict(other.storage.state_dict())


@pytest.mark.parametrize("shared_init", [False, True])
@pytest.mark.parametrize("change", [_empty_and_refill, _restore_other_rows])
def test_batches_drawn_ahead_of_rows_another_process_replaced_are_dropped(
        tmp_path, change, shared_init):
    storage = (LazyTensorStorage(64, shared_init=True) if shared_init
               else LazyMemmapStorage(64, scratch_dir=tmp_path / "mm"))
    rb = TensorDictReplayBuffer(storage=storage, batch_size=4, prefetch=3)
    rb.extend(era(20, 0))
    rb.sample()  # three batches now drawn ahead, all of era 0
    rb.state_dict()  # (waits until they are drawn: no thread holds the lock at the fork)
    child = mp.get_context("fork").Process(target=change, args=(rb,))
    child.start()
    child.join(60)
    if child.is_alive():
        child.kill()
    assert child.exitcode == 0
    assert rb[:]["era"].unique().tolist() == [1]
    eras = [rb.sample()["era"].unique().tolist() for _ in range(5)]
    assert eras == [[1]] * 5
