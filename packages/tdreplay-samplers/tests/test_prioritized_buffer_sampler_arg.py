"""``PrioritizedReplayBuffer(sampler=...)`` as TorchRL's: ``None`` builds the prioritized sampler
from ``alpha`` / ``beta`` / ...; a sampler given is used as it is (it was refused, even None)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ListStorage, RandomSampler
from tdreplay.samplers import (
    PrioritizedReplayBuffer,
    PrioritizedSampler,
    TensorDictPrioritizedReplayBuffer,
)


@pytest.mark.parametrize("cls", [PrioritizedReplayBuffer, TensorDictPrioritizedReplayBuffer])
def test_sampler_none_builds_the_prioritized_sampler(cls):
    rb = cls(alpha=0.7, beta=0.5, storage=ListStorage(10), sampler=None)
    assert isinstance(rb.sampler, PrioritizedSampler)
    assert rb.sampler.alpha == 0.7 and rb.sampler.beta == 0.5


@pytest.mark.parametrize("cls", [PrioritizedReplayBuffer, TensorDictPrioritizedReplayBuffer])
def test_a_sampler_given_is_used(cls):
    own = PrioritizedSampler(10, alpha=0.3, beta=0.9)
    rb = cls(alpha=0.7, beta=0.5, storage=ListStorage(10), sampler=own, batch_size=4)
    assert rb.sampler is own
    rb.extend(TensorDict({"x": torch.arange(6.0)}, [6]) if cls is TensorDictPrioritizedReplayBuffer
              else [torch.tensor(float(i)) for i in range(6)])
    _, info = rb.sample(return_info=True)
    assert info["index"].shape == (4,) and "priority_weight" in info


def test_a_random_sampler_given_samples_uniformly():
    rb = PrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=ListStorage(10),
                                 sampler=RandomSampler(), batch_size=3)
    assert isinstance(rb.sampler, RandomSampler)
    rb.extend([torch.tensor(i) for i in range(5)])
    assert rb.sample().shape == (3,)


def test_sampler_and_sampler_device_together_are_refused():
    with pytest.raises(TypeError, match="sampler_device cannot be passed when sampler"):
        PrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=ListStorage(10),
                                sampler=PrioritizedSampler(10, 0.7, 0.5), sampler_device="cpu")


def test_sync_false_needs_a_prioritized_sampler():
    with pytest.raises(TypeError, match="sync=False needs a PrioritizedSampler.*RandomSampler"):
        PrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=ListStorage(10),
                                sampler=RandomSampler(), sync=False)


def test_a_sampler_that_is_no_sampler_is_refused_naming_it():
    with pytest.raises(TypeError, match="sampler must be a Sampler, got str"):
        PrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=ListStorage(10),
                                sampler="prioritized")
