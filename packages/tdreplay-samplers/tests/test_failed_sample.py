"""A ``sample`` whose read-side transform raises changes nothing, whatever the sampler: the
same ``len``, the same sampler state, and the next batches are those an untouched twin buffer
(same data, same seed; generators seeded again after the failure, as random numbers drawn are
not given back) draws. Without-replacement slice samplers undo the draw (their epoch
position); the other samplers' draws change nothing that needs undoing, which this checks.

Each pair samples once before the failure: a first draw brings derived state up to date with
the writes (the trajectory index, a deferred sampler catching up), which is not undone."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer, testing
from tdreplay.samplers import (
    DeferredPrioritizedSampler,
    PrioritizedSampler,
    PrioritizedSliceSampler,
    PromptGroupSampler,
    SliceSampler,
    SliceSamplerWithoutReplacement,
    StalenessAwareSampler,
)
from tdreplay.storages import LazyTensorStorage

STEPS = 48  # 6 trajectories of 8 steps


class Boom(RuntimeError):
    """What the failing transform raises."""


#: identity, except that the call numbered ``at`` (from 0) raises :class:`Boom`
FailOnce = partial(testing.FailOnce, error=Boom)


def _data():
    step = torch.arange(STEPS)
    return TensorDict({"episode": step // 8, "obs": step.float(), "query": step % 4,
                       "policy_version": step // 12, ("next", "done"): step % 8 == 7}, [STEPS])


def _deferred():
    return DeferredPrioritizedSampler(PrioritizedSampler(STEPS, alpha=0.7, beta=0.5))


SAMPLERS = {
    "slice_without_replacement": lambda: SliceSamplerWithoutReplacement(
        slice_len=4, traj_key="episode"),
    "slice_without_replacement_drop_last": lambda: SliceSamplerWithoutReplacement(
        num_slices=4, traj_key="episode", drop_last=True),
    "slice": lambda: SliceSampler(slice_len=4, traj_key="episode"),
    "prioritized": lambda: PrioritizedSampler(STEPS, alpha=0.7, beta=0.5),
    "prioritized_slice": lambda: PrioritizedSliceSampler(STEPS, alpha=0.7, beta=0.5,
                                                         slice_len=4, traj_key="episode"),
    "deferred_prioritized": _deferred,
    "prompt_group_recency": lambda: PromptGroupSampler(num_groups=2, strategy="recency"),
    "staleness": lambda: StalenessAwareSampler(max_staleness=3),
}


def _pair(make_sampler, fail_at):
    buffers = []
    for transform in (FailOnce(fail_at), None):
        sampler = make_sampler()
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(STEPS), sampler=sampler,
                                    batch_size=16, transform=transform,
                                    generator=torch.Generator().manual_seed(0))
        if isinstance(sampler, DeferredPrioritizedSampler):
            sampler.follow(rb.writer)
        rb.extend(_data())
        buffers.append(rb)
    return buffers


def _same_batches(rb, twin, count):
    for _ in range(count):
        batch, info = rb.sample(return_info=True)
        expected, twin_info = twin.sample(return_info=True)
        testing.assert_same(info["index"], twin_info["index"], "index")
        testing.assert_same(batch["obs"], expected["obs"], "batch")
        assert rb.sampler.ran_out == twin.sampler.ran_out


@pytest.mark.parametrize("make_sampler", SAMPLERS.values(), ids=SAMPLERS.keys())
def test_failed_sample_changes_nothing(make_sampler):
    rb, twin = _pair(make_sampler, fail_at=1)
    _same_batches(rb, twin, 1)
    with pytest.raises(Boom):
        rb.sample()
    assert len(rb) == len(twin)
    testing.assert_same(rb.sampler.state_dict(), twin.sampler.state_dict(), "sampler state")
    for buffer in (rb, twin):
        buffer.sampler.generator.manual_seed(1)
    _same_batches(rb, twin, 4)  # past the end of an epoch of 6 trajectories
    testing.assert_same(rb.sampler.state_dict(), twin.sampler.state_dict(), "sampler state")


@pytest.mark.parametrize("shuffle", [True, False])
def test_slice_epoch_loses_no_trajectory_to_a_failed_sample(shuffle):
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(STEPS), batch_size=8, transform=FailOnce(at=1),
        sampler=SliceSamplerWithoutReplacement(slice_len=4, traj_key="episode",
                                               shuffle=shuffle))
    rb.extend(_data())
    seen = []
    with pytest.raises(Boom):
        for batch in rb:
            seen += batch["episode"].view(-1, 4)[:, 0].tolist()
    for batch in rb:  # the rest of the epoch
        seen += batch["episode"].view(-1, 4)[:, 0].tolist()
    assert sorted(seen) == list(range(6))
