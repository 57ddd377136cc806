"""``rb.set_storage(new)`` makes the sampler take the new storage's written slots, as a
buffer built over it does (0.6.2 kept the sampler as it was: a prioritized one drew slots of
the previous storage and every sample raised, or never drew the rows of a filled storage)."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from tdreplay.core import SamplerWithoutReplacement, TensorDictReplayBuffer
from tdreplay.samplers import PrioritizedSampler, TensorDictPrioritizedReplayBuffer
from tdreplay.storages import LazyTensorStorage, TensorStorage


def _td(n: int, start: int = 0) -> TensorDict:
    return TensorDict({"obs": torch.arange(start, start + n).float()}, [n])


def test_a_new_empty_storage_then_writes():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100),
                                sampler=PrioritizedSampler(100, 0.8, 0.5), batch_size=64)
    rb.extend(_td(100))
    rb.update_priority(torch.arange(50), torch.full((50,), 100.0))
    rb.set_storage(LazyTensorStorage(100))
    rb.extend(_td(10, 1000))
    sample = rb.sample()
    assert set(sample["index"].tolist()) <= set(range(10))
    assert (sample["obs"] >= 1000).all()
    assert abs(rb.sampler.total_priority - 10.0) < 1e-4  # the new rows' default priority


def test_a_filled_storage_is_sampled_whole():
    rb = TensorDictPrioritizedReplayBuffer(alpha=0.8, beta=0.5, storage=LazyTensorStorage(50),
                                           batch_size=400,
                                           generator=torch.Generator().manual_seed(0))
    rb.extend(_td(5))
    rb.set_storage(TensorStorage(_td(50, 100)))
    assert len(rb) == 50
    drawn = rb.sample()["index"]
    assert set(drawn.tolist()) == set(range(50))


def test_an_epoch_without_replacement_starts_on_the_new_storage():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10), batch_size=4,
                                sampler=SamplerWithoutReplacement())
    rb.extend(_td(10))
    rb.sample()  # mid-epoch on the old storage
    new = LazyTensorStorage(10)
    rb.set_storage(new)
    rb.extend(_td(6, 100))
    seen = torch.cat([rb.sample()["obs"], rb.sample(2)["obs"]])
    assert sorted(seen.tolist()) == [100.0, 101.0, 102.0, 103.0, 104.0, 105.0]
