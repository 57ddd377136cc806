"""A prioritized sampler whose ``max_capacity`` is below the rows of a storage filled before
it saw it (a dataset) grows its trees to hold them at the first sample, as it does for rows
written through the buffer (the first sample read the trees from before they grew and raised
"no written slot has a priority")."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.samplers import PrioritizedSampler
from tdreplay.storages import TensorStorage


def test_a_prefilled_storage_larger_than_max_capacity_is_sampled_whole():
    storage = TensorStorage(TensorDict({"x": torch.arange(52)}, [52]))
    rb = TensorDictReplayBuffer(storage=storage, sampler=PrioritizedSampler(3, 0.7, 0.4),
                                batch_size=64)
    torch.manual_seed(0)
    drawn = set()
    for _ in range(20):
        sample = rb.sample()
        assert torch.equal(sample["x"], sample["index"])
        drawn.update(sample["index"].tolist())
    assert max(drawn) >= 3 and drawn <= set(range(52)) and len(drawn) > 40
    assert rb.sampler.max_size >= 52
    assert torch.allclose(sample["priority_weight"], torch.ones(64))  # all default priority
