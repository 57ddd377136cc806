"""TorchRL's sampler arguments: ``replacement=``, ``end_keys=``, trajectory key detection and
fallback, and errors that are instances of what TorchRL raises."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ListStorage, TensorDictReplayBuffer
from tdreplay.core.testing import assert_same, buffer_snapshot
from tdreplay.samplers import (
    BatchLargerThanBufferError,
    PrioritizedSampler,
    PrioritizedSliceSampler,
    SamplerWithoutReplacement,
    SliceSampler,
    SliceSamplerWithoutReplacement,
)
from tdreplay.storages import LazyTensorStorage


def _rb(sampler: SliceSampler, size: int = 50, batch_size: int | None = None
        ) -> TensorDictReplayBuffer:
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(size), sampler=sampler,
                                batch_size=batch_size)
    rb.set_rng(torch.Generator().manual_seed(0))
    return rb


# ---- replacement= --------------------------------------------------------------------------------
def test_slice_sampler_replacement_false_is_the_variant_without_replacement() -> None:
    assert type(SliceSampler(slice_len=5)) is SliceSampler
    assert type(SliceSampler(slice_len=5, replacement=True)) is SliceSampler
    s = SliceSampler(replacement=False, slice_len=5, drop_last=True, shuffle=False,
                     traj_key="episode", strict_length=False)
    assert type(s) is SliceSamplerWithoutReplacement
    assert (s.slice_len, s.drop_last, s.shuffle, s.traj_key, s.strict_length) == \
        (5, True, False, "episode", False)
    assert isinstance(s, SamplerWithoutReplacement) and isinstance(s, SliceSampler)


def test_slice_sampler_replacement_false_samples_each_trajectory_once() -> None:
    rb = _rb(SliceSampler(replacement=False, slice_len=5, traj_key="episode", shuffle=False),
             batch_size=10)
    rb.extend(TensorDict({"episode": torch.arange(3).repeat_interleave(10),
                          "obs": torch.arange(30)}, [30]))
    batches = [b["obs"].view(-1, 5) for b in rb]
    starts = torch.cat(batches)[:, 0] // 10
    assert sorted(starts.tolist()) == [0, 1, 2]
    assert all(bool((b.diff(dim=1) == 1).all()) for b in batches)


def test_samplers_without_replacement_take_replacement_false_only() -> None:
    assert SamplerWithoutReplacement(replacement=False, drop_last=True).drop_last is True
    assert SliceSamplerWithoutReplacement(replacement=False, slice_len=5).slice_len == 5
    with pytest.raises(ValueError, match="replacement=True contradicts"):
        SamplerWithoutReplacement(replacement=True)
    with pytest.raises(ValueError, match="replacement=True contradicts"):
        SliceSamplerWithoutReplacement(slice_len=5, replacement=True)
    with pytest.raises(TypeError, match="replacement must be a bool"):
        SliceSampler(slice_len=5, replacement="no")


@pytest.mark.parametrize("make", [
    lambda: PrioritizedSampler(10, alpha=0.5, beta=0.5, replacement=False),
    lambda: PrioritizedSliceSampler(10, alpha=0.5, beta=0.5, slice_len=5, replacement=False),
])
def test_prioritized_samplers_have_no_variant_without_replacement(make) -> None:
    with pytest.raises(TypeError, match="no without-replacement variant"):
        make()


def test_prioritized_slice_sampler_is_not_dispatched() -> None:
    s = PrioritizedSliceSampler(10, alpha=0.5, beta=0.5, slice_len=5, replacement=True)
    assert type(s) is PrioritizedSliceSampler


# ---- drop_last -------------------------------------------------------------------------------------
def test_drop_last_batch_larger_than_buffer_is_a_value_and_runtime_error() -> None:
    storage = ListStorage(10)
    storage.set(torch.arange(4), list("abcd"))
    sampler = SamplerWithoutReplacement(drop_last=True)
    with pytest.raises(BatchLargerThanBufferError,
                       match=r"The batch size \(5\) is greater than the storage capacity \(4\)"):
        sampler.sample(storage, 5)
    assert issubclass(BatchLargerThanBufferError, ValueError)
    assert issubclass(BatchLargerThanBufferError, RuntimeError)
    assert sorted(sampler.sample(storage, 4)[0].tolist()) == [0, 1, 2, 3]  # unchanged


# ---- trajectory keys ---------------------------------------------------------------------------------
def _steps(**entries: torch.Tensor) -> TensorDict:
    n = next(iter(entries.values())).shape[0]
    return TensorDict({"obs": torch.arange(n), **entries}, [n])


def _slice_ids(batch: TensorDict, num_slices: int, key) -> torch.Tensor:
    return batch[key].reshape(num_slices, -1)


def test_collector_traj_ids_are_detected_before_episode() -> None:
    ids = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2])
    rb = _rb(SliceSampler(num_slices=2), size=8)
    rb.extend(TensorDict({("collector", "traj_ids"): ids, "episode": torch.zeros(8, dtype=torch.long),
                          "obs": torch.arange(8)}, [8]))
    for _ in range(10):
        sl = _slice_ids(rb.sample(6), 2, ("collector", "traj_ids"))
        assert bool((sl == sl[:, :1]).all())
    assert rb.sampler.traj_key == ("collector", "traj_ids")


def test_episode_is_detected_then_the_end_key() -> None:
    rb = _rb(SliceSampler(num_slices=2), size=8)
    rb.extend(_steps(episode=torch.tensor([0, 0, 0, 1, 1, 1, 2, 2])))
    rb.sample(6)
    assert rb.sampler.traj_key == "episode"
    done = torch.zeros(9, 1, dtype=torch.bool)
    done[[2, 5, 8]] = True
    rb = _rb(SliceSampler(num_slices=3), size=9)
    rb.extend(TensorDict({"obs": torch.arange(9), ("next", "done"): done}, [9]))
    obs = rb.sample(9)["obs"].view(3, 3)
    assert bool((obs[:, 0] % 3 == 0).all())  # each slice is one whole 3-step trajectory


def test_traj_key_missing_from_the_data_falls_back_to_the_end_key() -> None:
    done = torch.zeros(10, 1, dtype=torch.bool)
    done[[4, 9]] = True
    rb = _rb(SliceSampler(slice_len=5, traj_key="episode"), size=10)
    rb.extend(TensorDict({"obs": torch.arange(10), ("next", "done"): done}, [10]))
    with pytest.warns(UserWarning, match=r"traj_key='episode'\): the storage has no such entry.*"
                                         r"cut at the end flags \[\('next', 'done'\)\]"):
        rb.sample(10)
    for _ in range(5):
        obs = rb.sample(10)["obs"].view(2, 5)
        assert bool((obs[:, 0] % 5 == 0).all())


@pytest.mark.parametrize("make", [lambda: SliceSampler(slice_len=2, end_key=("next", "dnoe")),
                                  lambda: SliceSamplerWithoutReplacement(slice_len=2,
                                                                         end_key="stop")])
def test_an_end_key_given_alone_and_not_stored_is_refused(make) -> None:
    # a misspelt end key must not cut the trajectories along ids it never named (TorchRL
    # raises a RuntimeError too); the buffer is unchanged and samples once the key is right
    done = torch.zeros(8, 1, dtype=torch.bool)
    done[[1, 3, 5, 7]] = True
    data = TensorDict({"obs": torch.arange(8), "episode": torch.arange(8) // 4,
                       ("next", "done"): done}, [8])
    rb = _rb(make(), size=8)
    rb.extend(data)
    before = buffer_snapshot(rb)
    with pytest.raises(KeyError, match=r"the storage has no entry .*Name the entry that holds "
                                       r"the end-of-trajectory flags") as caught:
        rb.sample(4)
    assert isinstance(caught.value, RuntimeError)
    assert_same(buffer_snapshot(rb), before)
    fixed = _rb(SliceSampler(slice_len=2, end_key=("next", "done")), size=8)
    fixed.extend(data)
    obs = fixed.sample(4)["obs"].view(-1, 2)
    assert bool((obs[:, 0] % 2 == 0).all())  # two-step trajectories by the done flags


def test_end_keys_are_or_ed_and_missing_ones_skipped() -> None:
    truncated = torch.zeros(10, 1, dtype=torch.bool)
    truncated[[4, 9]] = True
    data = TensorDict({"obs": torch.arange(10),
                       ("next", "done"): torch.zeros(10, 1, dtype=torch.bool),
                       ("next", "truncated"): truncated}, [10])
    keys = [("next", "done"), ("next", "truncated"), ("next", "terminated")]
    rb = _rb(SliceSampler(slice_len=2, end_keys=keys), size=20)
    rb.extend(data)
    for _ in range(20):
        obs = rb.sample(4)["obs"].view(-1, 2)
        assert bool((obs[:, 1] == obs[:, 0] + 1).all()) and bool((obs[:, 0] != 4).all())
    assert rb.sampler.end_keys == tuple(keys)


def test_end_keys_missing_fall_back_to_trajectory_ids() -> None:
    rb = _rb(SliceSampler(slice_len=2, end_keys=[("next", "done")]), size=10)
    rb.extend(_steps(episode=torch.tensor([0] * 5 + [1] * 5)))
    for _ in range(10):
        obs = rb.sample(4)["obs"].view(-1, 2)
        assert bool((obs[:, 0] != 4).all())


@pytest.mark.parametrize("kwargs", [
    {"end_key": ("next", "done"), "end_keys": [("next", "done")]},
    {"ends": torch.zeros(3, dtype=torch.bool), "end_keys": [("next", "done")]},
])
def test_end_keys_conflicts_are_value_and_runtime_errors(kwargs) -> None:
    with pytest.raises(ValueError, match="exclusive|cannot be combined"):
        SliceSampler(slice_len=2, **kwargs)
    with pytest.raises(RuntimeError, match="exclusive|cannot be combined"):
        SliceSampler(slice_len=2, **kwargs)


@pytest.mark.parametrize("end_keys", [[], "done", 3])
def test_end_keys_must_be_a_sequence_of_keys(end_keys) -> None:
    with pytest.raises(ValueError, match="end_keys must be a non-empty sequence"):
        SliceSampler(slice_len=2, end_keys=end_keys)


# ---- positional arguments ------------------------------------------------------------------------
def test_prioritized_sampler_takes_torchrls_positional_arguments_device_included() -> None:
    sampler = PrioritizedSampler(8, 0.5, 0.4, 1e-6, torch.float64, "mean", True, "cpu")
    assert (sampler.max_capacity, sampler.alpha, sampler.beta, sampler.eps) == (8, 0.5, 0.4, 1e-6)
    assert sampler.reduction == "mean"
    sampler.extend(torch.arange(3))
    assert sampler.device == torch.device("cpu")
    with pytest.raises(TypeError, match="device"):
        PrioritizedSampler(8, 0.5, 0.4, 1e-6, torch.float64, "mean", True, 1.5)
