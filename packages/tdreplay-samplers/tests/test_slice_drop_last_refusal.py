"""``SliceSamplerWithoutReplacement(drop_last=True)`` never hands out an incomplete batch: when
an epoch cannot hold ``num_slices`` trajectories it raises (TorchRL's ``ValueError``; a
``BatchLargerThanBufferError``) and leaves the sampler as it was. ``SliceSampler`` given both
or neither of ``num_slices`` / ``slice_len`` raises a ``SliceSizeError`` (TorchRL's
``TypeError``, and a ``ValueError``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import BatchLargerThanBufferError, TensorDictReplayBuffer
from tdreplay.samplers import (
    PrioritizedSliceSampler,
    SliceSampler,
    SliceSamplerWithoutReplacement,
)
from tdreplay.samplers.slice import SliceSizeError
from tdreplay.storages import LazyTensorStorage


def steps(lengths: list[int]) -> TensorDict:
    episode = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])
    return TensorDict({"obs": torch.arange(float(episode.numel())), "episode": episode},
                      [episode.numel()])


def filled(lengths: list[int]) -> LazyTensorStorage:
    storage = LazyTensorStorage(40)
    data = steps(lengths)
    storage.set(torch.arange(data.numel()), data)
    return storage


def same_mark(a: tuple, b: tuple) -> bool:
    return np.array_equal(a[0], b[0]) and a[1:] == b[1:]


def same_state(a: dict, b: dict) -> bool:
    return all(torch.equal(a[k], b[k]) for k in ("epoch", "epoch_meta"))


# ---- drop_last ------------------------------------------------------------------------------------
def test_repro_fewer_trajectories_than_num_slices_raises_as_torchrl() -> None:
    sampler = SliceSamplerWithoutReplacement(num_slices=3, traj_key="episode", drop_last=True)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(40), sampler=sampler, batch_size=12)
    rb.extend(steps([6, 4]))
    for _ in range(2):  # was: 8 rows (2 slices), ran_out=True
        with pytest.raises(ValueError, match=r"drop_last=True.*num_slices=3") as info:
            rb.sample()
        assert isinstance(info.value, BatchLargerThanBufferError)
        assert isinstance(info.value, RuntimeError)
        assert "(2)" in str(info.value)


def test_one_trajectory_two_slices() -> None:
    storage = filled([7])
    sampler = SliceSamplerWithoutReplacement(num_slices=2, traj_key="episode", drop_last=True)
    with pytest.raises(BatchLargerThanBufferError, match="num_slices=2"):
        sampler.sample(storage, 2)


def test_refusal_leaves_the_sampler_as_it_was() -> None:
    storage = filled([6, 4])
    gen = torch.Generator().manual_seed(3)
    sampler = SliceSamplerWithoutReplacement(num_slices=3, traj_key="episode", drop_last=True)
    sampler.set_rng(gen)
    mark, state, rng = sampler.draw_mark(), sampler.state_dict(), gen.get_state()
    with pytest.raises(BatchLargerThanBufferError):
        sampler.sample(storage, 6)
    assert same_mark(sampler.draw_mark(), mark)
    assert same_state(sampler.state_dict(), state)
    assert torch.equal(gen.get_state(), rng)  # no random number drawn
    assert sampler.ran_out is False


def test_refusal_mid_epoch_restores_the_epoch_and_position() -> None:
    # 4 trajectories of 3, 3, 6, 6 steps; 2 slices of 3 steps a batch, in storage order
    storage = filled([3, 3, 6, 6])
    sampler = SliceSamplerWithoutReplacement(num_slices=2, traj_key="episode", drop_last=True,
                                             shuffle=False)
    first, _ = sampler.sample(storage, 6)
    assert storage[first]["episode"].tolist() == [0, 0, 0, 1, 1, 1]
    mark, state = sampler.draw_mark(), sampler.state_dict()
    # slices of 6 steps: 2 trajectories left that are long enough, but only 1 more batch, then
    # slices of 12 steps: no trajectory at all (a strict_length refusal, also state-neutral)
    with pytest.raises(RuntimeError, match="sufficient length"):
        sampler.sample(storage, 24)
    assert same_mark(sampler.draw_mark(), mark) and same_state(sampler.state_dict(), state)
    # slices of 5 steps and 3 slices: the 2 trajectories of 6 steps cannot fill a batch
    sampler.num_slices = 3
    with pytest.raises(BatchLargerThanBufferError, match="at least 5 steps"):
        sampler.sample(storage, 15)
    assert same_mark(sampler.draw_mark(), mark) and same_state(sampler.state_dict(), state)
    # the epoch goes on where it was
    sampler.num_slices = 2
    second, _ = sampler.sample(storage, 6)
    assert storage[second]["episode"].tolist()[::3] == [2, 3]
    assert sampler.ran_out is True


def test_strict_length_counts_only_trajectories_a_slice_fits_in() -> None:
    # 3 trajectories but one of them shorter than a slice: a complete batch is impossible
    storage = filled([5, 2, 5])
    sampler = SliceSamplerWithoutReplacement(num_slices=3, traj_key="episode", drop_last=True)
    with pytest.raises(BatchLargerThanBufferError, match=r"at least 4 steps.*\(2\)"):
        sampler.sample(storage, 12)
    relaxed = SliceSamplerWithoutReplacement(num_slices=3, traj_key="episode", drop_last=True,
                                             strict_length=False)
    index, _ = relaxed.sample(storage, 12)
    assert sorted(set(storage[index]["episode"].tolist())) == [0, 1, 2]


def test_enough_trajectories_and_drop_last_false_unchanged() -> None:
    storage = filled([6, 4])
    full = SliceSamplerWithoutReplacement(num_slices=2, traj_key="episode", drop_last=True)
    index, _ = full.sample(storage, 8)
    assert index.numel() == 8 and full.ran_out is True
    short = SliceSamplerWithoutReplacement(num_slices=3, traj_key="episode", drop_last=False)
    index, _ = short.sample(storage, 12)  # drop_last=False: the short batch, as before
    assert index.numel() == 8 and short.ran_out is True


# ---- num_slices / slice_len -------------------------------------------------------------------
MAKERS = {
    "slice": lambda **kw: SliceSampler(**kw),
    "slice_replacement_false": lambda **kw: SliceSampler(replacement=False, **kw),
    "without_replacement": lambda **kw: SliceSamplerWithoutReplacement(**kw),
    "prioritized": lambda **kw: PrioritizedSliceSampler(10, alpha=0.7, beta=0.5, **kw),
}


@pytest.mark.parametrize("name", list(MAKERS))
@pytest.mark.parametrize("kwargs", [{}, {"num_slices": 2, "slice_len": 3}])
def test_both_or_neither_size_is_a_type_and_value_error(name: str, kwargs: dict) -> None:
    with pytest.raises(TypeError, match="exactly one of num_slices and slice_len") as info:
        MAKERS[name](**kwargs)
    assert type(info.value) is SliceSizeError
    assert isinstance(info.value, ValueError)
    assert f"num_slices={kwargs.get('num_slices')!r}" in str(info.value)
    assert f"slice_len={kwargs.get('slice_len')!r}" in str(info.value)
