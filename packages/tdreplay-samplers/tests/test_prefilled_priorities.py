"""Rows already in a storage when a prioritized sampler first sees it get the default priority,
whether the first call is a write or a sample (as TorchRL's)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ReplayBuffer, TensorDictReplayBuffer
from tdreplay.samplers import PrioritizedSampler, PrioritizedSliceSampler
from tdreplay.storages import TensorStorage


def prefilled(n: int = 5) -> TensorStorage:
    return TensorStorage(TensorDict({"x": torch.arange(float(n)),
                                     "episode": torch.arange(n) // 3}, [n]))


@pytest.mark.parametrize("backend", ["numba", "torch"])
@pytest.mark.parametrize("first", ["write", "sample"])
def test_prefilled_rows_get_the_default_priority(backend: str, first: str) -> None:
    sampler = PrioritizedSampler(5, alpha=1.0, beta=1.0, eps=0.0, backend=backend)
    rb = TensorDictReplayBuffer(storage=prefilled(), sampler=sampler)
    if first == "sample":
        rb.sample(4)
    rb.add(TensorDict({"x": torch.tensor(7.0), "episode": torch.tensor(9)}, []))
    rb.set_rng(torch.Generator().manual_seed(0))
    assert sorted(set(rb.sample(200)["index"].tolist())) == [0, 1, 2, 3, 4]
    assert sampler.state_dict()["priorities"].tolist() == [1.0] * 5
    rb.update_priority(torch.tensor([3]), torch.tensor([2.0]))  # no IndexError
    assert sampler.state_dict()["priorities"].tolist() == [1.0, 1.0, 1.0, 2.0, 1.0]


def test_plain_buffer_write_first() -> None:
    sampler = PrioritizedSampler(5, alpha=1.0, beta=1.0, eps=0.0)
    rb = ReplayBuffer(storage=prefilled(), sampler=sampler)
    rb.add(TensorDict({"x": torch.tensor(7.0), "episode": torch.tensor(9)}, []))
    rb.update_priority(torch.tensor([0]), torch.tensor([4.0]))  # settles first: 1..4 get 1.0
    assert sampler.state_dict()["priorities"].tolist() == [4.0, 1.0, 1.0, 1.0, 1.0]
    rb.update_priority(torch.tensor([3]), torch.tensor([2.0]))  # a priority it holds


def test_prioritized_slice_sampler_prefilled_write_first() -> None:
    sampler = PrioritizedSliceSampler(6, alpha=1.0, beta=1.0, eps=0.0, slice_len=3,
                                      traj_key="episode")
    rb = TensorDictReplayBuffer(storage=prefilled(6), sampler=sampler)
    rb.add(TensorDict({"x": torch.tensor(7.0), "episode": torch.tensor(0)}, []))
    rb.set_rng(torch.Generator().manual_seed(0))
    index = rb.sample(300)["index"].view(-1, 3)
    # row 0 is now the newest step of the full ring, rows 1 and 2 older: (0, 1, 2) would join
    # the newest to the oldest, and episode 0's rows 1, 2 are too short a trajectory
    assert sorted({tuple(r) for r in index.tolist()}) == [(3, 4, 5)]
    assert sampler.priorities.state_dict()["priorities"].tolist() == [1.0] * 6
