"""A round-robin writer writes after the storage's written rows while it has free ones,
whatever happened to the storage past the writer: a restore with more or fewer rows (on
the storage itself or through another buffer of it), ``storage.empty()``, a storage
written by another buffer (``set_storage``, ``set_writer``, a new buffer). It went on at
its own cursor: it overwrote rows while free ones were left, or counted rows a restore or
an empty had removed as written again, with their old contents."""

from __future__ import annotations

import copy

import pytest
import torch

from tdreplay.core import ListStorage, ReplayBuffer, RoundRobinWriter, TensorDictReplayBuffer
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage

STORAGES = [lambda: LazyTensorStorage(16), lambda: LazyMemmapStorage(16),
            lambda: ListStorage(16)]


def _rows(rb: ReplayBuffer) -> list[int]:
    return [int(x) for x in rb[:]]


@pytest.mark.parametrize("make", STORAGES)
def test_a_storage_restored_with_more_rows(make):
    rb = ReplayBuffer(storage=make())
    rb.extend(torch.arange(10))
    state = copy.deepcopy(rb.storage.state_dict())
    rb.empty()
    rb.extend(torch.arange(100, 102))  # cursor 2
    rb.storage.load_state_dict(state)
    assert rb.extend(torch.tensor([900])).tolist() == [10]
    assert _rows(rb) == [*range(10), 900]


@pytest.mark.parametrize("make", STORAGES)
def test_a_storage_restored_with_fewer_rows(make):
    rb = ReplayBuffer(storage=make())
    rb.extend(torch.arange(3))
    state = copy.deepcopy(rb.storage.state_dict())
    rb.extend(torch.arange(100, 108))  # cursor 11
    rb.storage.load_state_dict(state)
    assert rb.extend(torch.tensor([900])).tolist() == [3]
    assert _rows(rb) == [0, 1, 2, 900]


@pytest.mark.parametrize("make", STORAGES)
def test_a_restore_through_another_buffer_of_the_storage(make):
    storage = make()
    writer = ReplayBuffer(storage=storage)
    writer.extend(torch.arange(3))
    state = copy.deepcopy(writer.state_dict())
    writer.extend(torch.arange(100, 108))
    reader = ReplayBuffer(storage=storage)
    reader.load_state_dict(state)
    assert writer.extend(torch.tensor([900])).tolist() == [3]
    assert _rows(writer) == [0, 1, 2, 900]


@pytest.mark.parametrize("make", STORAGES[:2])
def test_storage_empty_past_the_buffer(make):
    rb = ReplayBuffer(storage=make())
    rb.extend(torch.arange(10))
    rb.storage.empty()
    assert rb.extend(torch.arange(100, 102)).tolist() == [0, 1]
    assert _rows(rb) == [100, 101]


@pytest.mark.parametrize("make", STORAGES)
def test_a_writer_on_a_storage_another_buffer_filled(make):
    rb = ReplayBuffer(storage=make())
    rb.extend(torch.tensor([0]))
    filled = make()
    ReplayBuffer(storage=filled).extend(torch.arange(100, 110))
    rb.set_storage(filled)
    assert rb.extend(torch.tensor([999])).tolist() == [10]
    other = ReplayBuffer(storage=filled)  # a new buffer (and writer) of the same storage
    assert other.extend(torch.tensor([998])).tolist() == [11]
    rb.set_writer(RoundRobinWriter())
    assert rb.add(torch.tensor(997)) == 12
    assert _rows(rb) == [*range(100, 110), 999, 998, 997]


def test_a_full_storage_goes_on_at_the_cursor():
    rb = ReplayBuffer(storage=LazyTensorStorage(4))
    rb.extend(torch.arange(6))  # wrapped: cursor 2
    assert rb.extend(torch.tensor([9])).tolist() == [2]
    assert _rows(rb) == [4, 5, 9, 3]


def test_ndim_2_rows_are_counted_in_rows():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(16, ndim=2))
    from tensordict import TensorDict

    rb.extend(TensorDict({"x": torch.arange(6.0).reshape(2, 3)}, [2, 3]))  # 3 rows of 2 envs
    state = copy.deepcopy(rb.storage.state_dict())
    rb.extend(TensorDict({"x": torch.zeros(2, 3)}, [2, 3]))
    rb.storage.load_state_dict(state)
    assert rb.extend(TensorDict({"x": torch.ones(2, 1)}, [2, 1])).reshape(-1).tolist() == [6, 7]
