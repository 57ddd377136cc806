"""A member of a ``ReplayBufferEnsemble`` emptied or restored (through the member, or on its
storage): the batches the ensemble drew ahead of its old rows are dropped; and resets of the
ensemble's storage and of the ensemble itself from two threads never deadlock."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ReplayBuffer
from tdreplay.ensembles import ReplayBufferEnsemble
from tdreplay.storages import LazyTensorStorage


def _rows(first: int, n: int) -> TensorDict:
    return TensorDict(x=torch.arange(first, first + n), batch_size=[n])


def _member(first: int) -> ReplayBuffer:
    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    rb.extend(_rows(first, 10))
    return rb


@pytest.mark.parametrize("reset", ["storage.empty", "empty", "storage.load_state_dict",
                                   "load_state_dict"])
def test_batches_drawn_ahead_of_a_member_reset_are_dropped(reset):
    # the ensemble is told of no member reset (its storage is a storage of storages): it
    # handed out 3 batches of the member's rows that were gone
    a, b = _member(100), _member(200)
    ensemble = ReplayBufferEnsemble(a, b, batch_size=4, prefetch=3, sample_from_all=True)
    ensemble.sample()  # (3 batches queued)
    source = ReplayBuffer(storage=LazyTensorStorage(10))
    source.extend(_rows(1000, 3))
    if reset.startswith("storage."):
        target, state = a.storage, source.storage.state_dict()
    else:
        target, state = a, source.state_dict()
    if reset.endswith("empty"):
        target.empty()
        a.extend(_rows(1000, 2))
    else:
        target.load_state_dict(state)
    for _ in range(4):
        parts = ensemble.sample()
        assert all(x >= 1000 for x in parts[0]["x"].tolist())


def test_resets_of_the_ensemble_and_of_its_storage_from_two_threads_finish():
    # ens.empty() held the members' locks and waited for the storage ensemble's lock, which
    # ens.storage.empty() held while it waited for a member's lock
    a, b = _member(0), _member(10)
    ensemble = ReplayBufferEnsemble(a, b, batch_size=4)
    stop = time.monotonic() + 2.0
    done: list[str] = []

    def loop(reset, name):
        while time.monotonic() < stop:
            reset()
            for member in (a, b):
                member.extend(_rows(0, 5))
        done.append(name)

    threads = [threading.Thread(target=loop, args=(ensemble.empty, "ensemble"), daemon=True),
               threading.Thread(target=loop, args=(ensemble.storage.empty, "storage"),
                                daemon=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert sorted(done) == ["ensemble", "storage"]
    assert len(a) in (0, 5, 10) and len(b) in (0, 5, 10)
