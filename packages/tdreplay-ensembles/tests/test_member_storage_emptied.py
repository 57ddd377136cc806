"""A member's storage emptied or restored past the ensemble (``rb.storage.empty()`` /
``rb.storage.load_state_dict``, as TorchRL programs do) under a prioritized sampler: the
member's own ``sample`` healed, but every ensemble sample drawing that member raised
``IndexError`` (its sampler still held the old slots). The ensemble now has the member's
sampler learn the written slots anew, as the member buffer does."""

from __future__ import annotations

import copy

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.ensembles import ReplayBufferEnsemble
from tdreplay.samplers import PrioritizedSampler
from tdreplay.storages import LazyTensorStorage


def _rows(n: int, start: int) -> TensorDict:
    return TensorDict({"id": torch.arange(start, start + n)}, [n])


def _ensemble() -> tuple[ReplayBufferEnsemble, TensorDictReplayBuffer]:
    prioritized = TensorDictReplayBuffer(storage=LazyTensorStorage(10),
                                         sampler=PrioritizedSampler(10, 0.7, 0.5))
    uniform = TensorDictReplayBuffer(storage=LazyTensorStorage(10))
    prioritized.extend(_rows(10, 0))
    uniform.extend(_rows(10, 100))
    ens = ReplayBufferEnsemble(prioritized, uniform, batch_size=8, sample_from_all=True,
                               generator=torch.Generator().manual_seed(0))
    ens.sample()  # the member's sampler knows its 10 slots
    return ens, prioritized


def test_a_member_storage_emptied_past_the_ensemble_is_sampled_after_new_writes():
    ens, member = _ensemble()
    member.storage.empty()
    member.extend(_rows(3, 50))
    for _ in range(20):
        ids = ens.sample()["id"]
        assert set(ids[0].tolist()) <= {50, 51, 52}  # only the rows written since
        assert bool((ids[1] >= 100).all())


def test_a_member_storage_restored_past_the_ensemble_is_sampled():
    ens, member = _ensemble()
    saved = copy.deepcopy(member.storage.state_dict())  # 10 rows
    member.storage.empty()
    member.extend(_rows(4, 50))
    member.sample(2)  # the member heals its own sampler: 4 slots
    member.storage.load_state_dict(saved)
    member.storage.empty()  # emptied past the ensemble again, then 2 new rows
    member.extend(_rows(2, 70))
    seen = torch.cat([ens.sample()["id"][0] for _ in range(20)])
    assert set(seen.tolist()) == {70, 71}


def test_a_member_sampler_drawing_missing_slots_without_a_reset_still_raises():
    # a storage written past the sampler (no empty, no restore) is not healed silently
    class OffByOne(PrioritizedSampler):
        def sample(self, storage, batch_size):
            index, info = super().sample(storage, batch_size)
            return index + len(storage), info

    member = TensorDictReplayBuffer(storage=LazyTensorStorage(8), sampler=OffByOne(8, 0.7, 0.5))
    other = TensorDictReplayBuffer(storage=LazyTensorStorage(8))
    member.extend(_rows(4, 0))
    other.extend(_rows(4, 100))
    ens = ReplayBufferEnsemble(member, other, batch_size=4, sample_from_all=True)
    with pytest.raises(IndexError):
        ens.sample()


@pytest.mark.parametrize("reset", ["empty", "load_state_dict"])
def test_a_prefetching_ensemble_drops_batches_of_a_member_emptied_or_restored(reset):
    # the three batches drawn ahead still held the member's old rows (ids 0-15)
    members = [TensorDictReplayBuffer(storage=LazyTensorStorage(16)) for _ in range(2)]
    members[0].extend(_rows(16, 0))
    members[1].extend(_rows(16, 1000))
    other = TensorDictReplayBuffer(storage=LazyTensorStorage(16))
    other.extend(_rows(16, 8000))
    saved = copy.deepcopy(other.state_dict())
    ens = ReplayBufferEnsemble(*members, batch_size=16, prefetch=3, sample_from_all=True)
    ens.sample()
    if reset == "empty":
        members[0].empty()
        members[0].extend(_rows(16, 8000))
    else:
        members[0].load_state_dict(saved)
    for _ in range(4):
        assert bool((ens.sample()["id"][0] >= 8000).all())
