"""Slice-sampler refusals TorchRL raises as ``RuntimeError`` are ``RuntimeError`` and
``ValueError`` (:class:`SliceBatchError`); a right span lets a ``PrioritizedSliceSampler`` cut
slices longer than the buffer (as TorchRL)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ReplayBuffer, TensorDictReplayBuffer
from tdreplay.samplers import (
    PrioritizedSliceSampler,
    SliceBatchError,
    SliceSampler,
    SliceSamplerWithoutReplacement,
    StreamingSliceSampler,
)
from tdreplay.storages import LazyTensorStorage


def data(n: int, episodes: list[int]) -> TensorDict:
    return TensorDict({"obs": torch.arange(float(n)), "episode": torch.tensor(episodes)}, [n])


SAMPLERS = {
    "slice": lambda **kw: SliceSampler(traj_key="episode", **kw),
    "without_replacement": lambda **kw: SliceSamplerWithoutReplacement(traj_key="episode", **kw),
    "prioritized": lambda **kw: PrioritizedSliceSampler(10, alpha=0.7, beta=1.0,
                                                        traj_key="episode", **kw),
    "streaming": lambda **kw: StreamingSliceSampler(traj_key="episode", **kw),
}


def test_error_class() -> None:
    assert issubclass(SliceBatchError, ValueError) and issubclass(SliceBatchError, RuntimeError)


@pytest.mark.parametrize("name", list(SAMPLERS))
@pytest.mark.parametrize("error", [RuntimeError, ValueError])
def test_batch_not_divisible(name: str, error: type[Exception]) -> None:
    rb = ReplayBuffer(storage=LazyTensorStorage(10), sampler=SAMPLERS[name](slice_len=3))
    rb.extend(data(6, [0] * 6))
    with pytest.raises(error, match="not divisible by slice_len=3"):
        rb.sample(4)
    if name != "without_replacement":  # (TorchRL's answers by its storage length)
        with pytest.raises(error, match="not divisible"):
            rb.can_sample(4)
    rb = ReplayBuffer(storage=LazyTensorStorage(10), sampler=SAMPLERS[name](slice_len=3),
                      batch_size=4)
    rb.extend(data(6, [0] * 6))
    with pytest.raises(error, match="not divisible"):
        next(iter(rb))


@pytest.mark.parametrize("name", ["slice", "without_replacement"])
@pytest.mark.parametrize("error", [RuntimeError, ValueError])
def test_num_slices_not_divisible(name: str, error: type[Exception]) -> None:
    rb = ReplayBuffer(storage=LazyTensorStorage(10), sampler=SAMPLERS[name](num_slices=3))
    rb.extend(data(6, [0] * 6))
    with pytest.raises(error, match="not divisible by num_slices=3"):
        rb.sample(4)


@pytest.mark.parametrize("name", list(SAMPLERS))
@pytest.mark.parametrize("error", [RuntimeError, ValueError])
def test_strict_slices_longer_than_the_buffer(name: str, error: type[Exception]) -> None:
    rb = ReplayBuffer(storage=LazyTensorStorage(10),
                      sampler=SAMPLERS[name](slice_len=4, strict_length=True))
    rb.extend(data(2, [0, 0]))
    with pytest.raises(error, match="longer than the 2 steps"):
        rb.sample(4)


@pytest.mark.parametrize("error", [RuntimeError, ValueError])
def test_strict_slices_longer_than_max_size(error: type[Exception]) -> None:
    rb = ReplayBuffer(storage=LazyTensorStorage(3),
                      sampler=SliceSampler(slice_len=4, traj_key="episode"))
    rb.extend(data(3, [0, 0, 0]))
    with pytest.raises(error, match="longer than the whole buffer"):
        rb.sample(4)


def test_slice_sampler_right_span_still_refuses_slices_longer_than_the_buffer() -> None:
    sampler = SliceSampler(num_slices=1, traj_key="episode", span=(False, True))
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10), sampler=sampler)
    rb.extend(data(3, [0, 0, 0]))
    with pytest.raises(RuntimeError, match="longer than the 3 steps"):  # as TorchRL
        rb.sample(4)


@pytest.mark.parametrize("span", [(False, True), (False, 2)])
def test_prioritized_right_span_cuts_slices_longer_than_the_buffer(span) -> None:
    sampler = PrioritizedSliceSampler(10, alpha=1.0, beta=1.0, num_slices=1,
                                      traj_key="episode", span=span)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10), sampler=sampler)
    rb.extend(data(3, [0, 0, 0]))
    rb.set_rng(torch.Generator().manual_seed(0))
    seen = {tuple(rb.sample(4)["obs"].tolist()) for _ in range(100)}
    # slices of 4 steps cut at the end of the 3-step trajectory
    expected = {(0.0, 1.0, 2.0), (1.0, 2.0)} | ({(2.0,)} if span[1] is True else set())
    assert seen == expected


def test_prioritized_right_span_on_a_small_storage() -> None:
    sampler = PrioritizedSliceSampler(3, alpha=1.0, beta=1.0, slice_len=4,
                                      traj_key="episode", span=(False, 2))
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(3), sampler=sampler)
    rb.extend(data(3, [0, 0, 0]))
    rb.set_rng(torch.Generator().manual_seed(0))
    assert {tuple(rb.sample(4)["obs"].tolist()) for _ in range(50)} == {(0.0, 1.0, 2.0),
                                                                       (1.0, 2.0)}
    sampler = PrioritizedSliceSampler(3, alpha=1.0, beta=1.0, slice_len=6,
                                      traj_key="episode", span=(False, 2))
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(3), sampler=sampler)
    rb.extend(data(3, [0, 0, 0]))
    with pytest.raises(RuntimeError, match="longer than the whole buffer"):
        rb.sample(6)  # 6 - 2 = 4 steps needed before the overhang, 3 at most stored


@pytest.mark.parametrize("slice_len", [1, 2])
def test_prioritized_int_right_span_as_long_as_a_slice_is_refused(slice_len: int) -> None:
    # TorchRL draws starts only from the first steps of the longest trajectories there
    sampler = PrioritizedSliceSampler(16, alpha=0.7, beta=1.0, slice_len=slice_len,
                                      traj_key="episode", span=(False, slice_len))
    rb = ReplayBuffer(storage=LazyTensorStorage(16), sampler=sampler)
    rb.extend(data(6, [0, 0, 0, 1, 1, 1]))
    with pytest.raises(ValueError, match="span on the right"):
        rb.sample(2 * slice_len)
