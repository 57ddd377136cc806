"""TorchRL's public attributes of the samplers: ``default_priority``, ``dtype``, ``max_size``,
``len_storage``."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from tdreplay.core import RandomSampler, ReplayBuffer
from tdreplay.samplers import (
    PrioritizedSampler,
    PrioritizedSliceSampler,
    SamplerWithoutReplacement,
    SliceSampler,
    SliceSamplerWithoutReplacement,
)
from tdreplay.storages import LazyTensorStorage


def test_default_priority() -> None:
    assert RandomSampler().default_priority == 1.0
    assert SliceSampler(slice_len=2).default_priority == 1.0
    rb = ReplayBuffer(storage=LazyTensorStorage(5), sampler=PrioritizedSampler(5, 0.7, 0.5))
    rb.extend(torch.arange(3.0))
    assert rb.sampler.default_priority == 1.0
    rb.update_priority(torch.arange(3), torch.tensor([0.5, 3.0, 2.0]))
    assert rb.sampler.default_priority == 3.0
    sampler = PrioritizedSliceSampler(6, 0.7, 0.5, slice_len=2)
    assert sampler.default_priority == 1.0
    sampler.extend(torch.arange(2))
    sampler.update_priority(torch.arange(2), torch.tensor([2.5, 0.5]))
    assert sampler.default_priority == 2.5


def test_dtype_and_max_size() -> None:
    sampler = PrioritizedSampler(5, 0.7, 0.5)
    assert (sampler.dtype, sampler.max_size) == (torch.float32, 5)
    sampler = PrioritizedSampler(7, 0.7, 0.5, dtype=torch.float64)
    assert (sampler.dtype, sampler.max_size) == (torch.float64, 7)
    sampler = PrioritizedSliceSampler(6, 0.7, 0.5, dtype=torch.float64, slice_len=2)
    assert (sampler.dtype, sampler.max_size) == (torch.float64, 6)


def test_len_storage_of_sampler_without_replacement() -> None:
    rb = ReplayBuffer(storage=LazyTensorStorage(5), sampler=SamplerWithoutReplacement(),
                      batch_size=2)
    assert rb.sampler.len_storage == 0
    rb.extend(torch.arange(3.0))
    assert rb.sampler.len_storage == 0  # as TorchRL: set by a sample
    rb.sample()
    assert rb.sampler.len_storage == 3
    rb.extend(torch.arange(2.0))
    rb.sample()
    assert rb.sampler.len_storage == 5
    rb.empty()
    assert rb.sampler.len_storage == 0


def test_len_storage_of_slice_sampler_without_replacement() -> None:
    sampler = SliceSamplerWithoutReplacement(slice_len=2, traj_key="episode")
    rb = ReplayBuffer(storage=LazyTensorStorage(20), sampler=sampler)
    assert sampler.len_storage == 0
    rb.extend(TensorDict({"episode": torch.tensor([0, 0, 1, 1, 1, 2, 2])}, [7]))
    rb.sample(4)
    assert sampler.len_storage == 3  # trajectories, as TorchRL's
    rb.empty()
    assert sampler.len_storage == 0
