"""Behaviours taken from TorchRL: where a prioritized sampler without a generator draws from,
and which end-of-trajectory signals slice samplers refuse."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ListStorage
from tdreplay.samplers import PrioritizedSampler, SliceSampler
from tdreplay.storages import LazyTensorStorage


def _filled(n: int) -> tuple[ListStorage, PrioritizedSampler]:
    storage = ListStorage(n)
    storage.set(torch.arange(n), list(range(n)))
    sampler = PrioritizedSampler(n, alpha=0.0, beta=1.0)  # alpha=0: every slot weighs 1
    sampler.extend(torch.arange(n))
    return storage, sampler


def test_prioritized_draws_from_numpy_global_rng_without_generator() -> None:
    storage, sampler = _filled(8)
    np.random.seed(0)
    first = sampler.sample(storage, 16)[0]
    torch.manual_seed(123)  # torch's generator plays no part on the CPU
    np.random.seed(0)
    again = sampler.sample(storage, 16)[0]
    assert torch.equal(first, again)
    # the draws are NumPy's uniforms scaled by the total mass (8 equal slots: floor(8 u))
    np.random.seed(0)
    expected = np.floor(np.random.random_sample(16) * 8).astype(np.int64)
    assert first.tolist() == expected.tolist()


def test_prioritized_generator_still_wins_over_numpy() -> None:
    storage, sampler = _filled(8)
    sampler.set_rng(torch.Generator().manual_seed(5))
    np.random.seed(0)
    first = sampler.sample(storage, 16)[0]
    sampler.set_rng(torch.Generator().manual_seed(5))
    np.random.seed(1)  # a different NumPy state changes nothing
    assert torch.equal(first, sampler.sample(storage, 16)[0])


def _episodes(done: torch.Tensor) -> TensorDict:
    return TensorDict({"obs": torch.arange(20.0), ("next", "done"): done}, [20])


def test_slice_sampler_refuses_several_end_flags_per_step() -> None:
    done = torch.zeros(20, 1, dtype=torch.bool)
    done[[9, 19]] = True
    storage = LazyTensorStorage(20)
    storage.set(torch.arange(20), _episodes(done.unsqueeze(1).expand(20, 5, 1)))
    sampler = SliceSampler(num_slices=2)
    with pytest.raises(RuntimeError, match="end-of-trajectory signal to be 1-dimensional") as err:
        sampler.sample(storage, 10)
    assert isinstance(err.value, ValueError)
    assert "('next', 'done')" in str(err.value) and "5 values per step" in str(err.value)


def test_slice_sampler_accepts_one_flag_per_step_with_trailing_dim() -> None:
    done = torch.zeros(20, 1, dtype=torch.bool)
    done[[9, 19]] = True
    storage = LazyTensorStorage(20)
    storage.set(torch.arange(20), _episodes(done))
    index, info = SliceSampler(num_slices=2).sample(storage, 10)
    starts = index.view(2, 5)[:, 0]
    # every slice lies within one episode ([0, 10) or [10, 20))
    assert ((index.view(2, 5) // 10) == (starts // 10)[:, None]).all()
