"""An ensemble ``sample`` that raises changes no member: a member refusing its part (a batch
its slice sampler cannot cut, every item consumed), a member's or the ensemble's transform
raising. Members whose draws change state (without replacement, consuming) are compared with
their state before, and the batches after the failure with those of an untouched twin."""

from __future__ import annotations

import copy
from functools import partial

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import (
    ConsumingSampler,
    SamplerWithoutReplacement,
    TensorDictReplayBuffer,
    testing,
)
from tdreplay.ensembles import ReplayBufferEnsemble
from tdreplay.samplers import SliceSamplerWithoutReplacement
from tdreplay.storages import LazyTensorStorage


class Boom(RuntimeError):
    """What the failing transform raises."""


#: identity, except that the call numbered ``at`` (from 0) raises :class:`Boom`
FailOnce = partial(testing.FailOnce, error=Boom)


def _member(sampler, buffer_id, n=12, transform=None):
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(n), sampler=sampler,
                                transform=transform)
    rows = torch.arange(n)
    rb.extend(TensorDict({"obs": (buffer_id * 100 + rows).float(), "episode": rows // 4}, [n]))
    return rb


def _states(ensemble):
    """Every member's length and sampler state (copies)."""
    return [(len(rb), copy.deepcopy(rb.sampler.state_dict())) for rb in ensemble.buffers]


def _obs(sample):
    return sample["obs"].tolist()


def test_a_member_refusing_its_part_changes_no_member():
    # 6 items in 2 parts of 3: the slice sampler (slices of 4 steps) refuses its part after
    # the without-replacement member has drawn
    rb = ReplayBufferEnsemble(_member(SamplerWithoutReplacement(shuffle=False), 0),
                              _member(SliceSamplerWithoutReplacement(slice_len=4,
                                                                     traj_key="episode"), 1),
                              sample_from_all=True)
    rb.sample(8)  # parts of 4: both members draw
    before = _states(rb)
    with pytest.raises(ValueError, match="divisible"):
        rb.sample(6)
    testing.assert_same(_states(rb), before)
    assert _obs(rb.sample(8))[0] == [4.0, 5.0, 6.0, 7.0]


def test_a_consumed_member_changes_no_member():
    rb = ReplayBufferEnsemble(_member(SamplerWithoutReplacement(shuffle=False), 0),
                              _member(ConsumingSampler(), 1, n=4), sample_from_all=True)
    rb.sample(8)  # the consuming member is used up
    before = _states(rb)
    with pytest.raises(RuntimeError, match="consumed"):
        rb.sample(8)
    testing.assert_same(_states(rb), before)
    rb[1].extend(TensorDict({"obs": torch.zeros(4), "episode": torch.zeros(4, dtype=torch.long)},
                            [4]))
    assert _obs(rb.sample(8))[0] == [4.0, 5.0, 6.0, 7.0]  # where the epoch was


def _pair(member_transform=None, transform=None, **kwargs):
    """An ensemble whose member 1 or own transform fails once, and its untouched twin."""
    pair = []
    for failing in (True, False):
        members = [_member(SamplerWithoutReplacement(shuffle=False), 0),
                   _member(ConsumingSampler(), 1,
                           transform=member_transform if failing else None)]
        pair.append(ReplayBufferEnsemble(*members, sample_from_all=True,
                                         transform=transform if failing else None,
                                         generator=torch.Generator().manual_seed(0), **kwargs))
    return pair


def _reseed(*ensembles):
    for rb in ensembles:
        rb.sampler.generator.manual_seed(1)


@pytest.mark.parametrize("where", ["member", "ensemble"])
def test_a_failing_transform_changes_no_member(where):
    failing = {"member_transform" if where == "member" else "transform": FailOnce(at=1)}
    rb, twin = _pair(**failing)
    assert _obs(rb.sample(4)) == _obs(twin.sample(4))
    before = _states(rb)
    with pytest.raises(Boom):
        rb.sample(4)
    testing.assert_same(_states(rb), before)
    testing.assert_same(_states(rb), _states(twin))
    _reseed(rb, twin)
    for _ in range(2):
        assert _obs(rb.sample(4)) == _obs(twin.sample(4))
    assert _obs(rb.sample(4))[0] == _obs(twin.sample(4))[0] == [6.0, 7.0]


def test_a_batch_drawn_ahead_that_fails_loses_nothing():
    # with prefetch, the failed batch is undone in the worker and no batch is drawn behind it
    # until its error is handed out: the batches after it are those of a twin that never failed
    rb, twin = _pair(transform=FailOnce(at=1), prefetch=2, batch_size=2)
    twin_batches = [_obs(twin.sample())[0] for _ in range(4)]
    batches = [_obs(rb.sample())[0]]
    with pytest.raises(Boom):
        rb.sample()
    batches += [_obs(rb.sample())[0] for _ in range(3)]
    assert batches == twin_batches == [[0.0], [1.0], [2.0], [3.0]]


def _vecnorm_state(rb):
    return copy.deepcopy(rb.transform.state_dict())


@pytest.mark.parametrize("failing_member", [1, "join"])
def test_a_failed_part_puts_back_the_statistics_of_the_members_before_it(failing_member):
    # member 0's VecNorm runs on its part first; member 1's transform (or the join of the
    # parts) then raises: the statistics hold no trace of the refused batch
    from tdreplay.transforms import VecNorm

    def refuse(parts):
        raise Boom("join")

    members = [_member(SamplerWithoutReplacement(shuffle=False), 0,
                       transform=VecNorm(in_keys=["obs"], decay=0.9)),
               _member(SamplerWithoutReplacement(shuffle=False), 1,
                       transform=FailOnce(at=0) if failing_member == 1 else None)]
    rb = ReplayBufferEnsemble(*members, sample_from_all=True,
                              collate_fn=refuse if failing_member == "join" else None)
    before = _vecnorm_state(members[0])
    with pytest.raises(Boom):
        rb.sample(4)
    testing.assert_same(_vecnorm_state(members[0]), before)
    if failing_member == 1:  # the next batch goes through, and is counted once
        rb.sample(4)
        assert _vecnorm_state(members[0]) != before


@pytest.mark.parametrize("how", ["sample", "prefetch", "index"])
def test_the_ensemble_transform_raising_puts_back_the_member_statistics(how):
    # every part goes through its member's transform (VecNorm), then the ensemble's own
    # transform refuses the joined batch: the members' statistics hold no trace of it, and the
    # next batch is counted once
    from tdreplay.transforms import VecNorm

    def make(fail_at):
        members = [_member(SamplerWithoutReplacement(shuffle=False), i,
                           transform=VecNorm(in_keys=["obs"], decay=0.9)) for i in range(2)]
        return ReplayBufferEnsemble(*members, sample_from_all=True, transform=FailOnce(at=fail_at),
                                    prefetch=2 if how == "prefetch" else None,
                                    batch_size=4)

    rb, twin = make(fail_at=0), make(fail_at=-1)  # the twin's transform never raises
    assert rb.has_read_state
    before = [_vecnorm_state(member) for member in rb.buffers]
    with pytest.raises(Boom):
        if how == "index":
            rb[:, 0:2]
        else:
            rb.sample()
    testing.assert_same([_vecnorm_state(member) for member in rb.buffers], before)
    testing.assert_same(_states(rb), _states(twin))
    if how == "index":
        rb[:, 0:2], twin[:, 0:2]
    else:
        assert _obs(rb.sample()) == _obs(twin.sample())
    if how != "prefetch":  # (there the worker's batches drawn ahead count too, when they run)
        testing.assert_same([_vecnorm_state(m) for m in rb.buffers],
                            [_vecnorm_state(m) for m in twin.buffers])
    assert [_vecnorm_state(m) for m in rb.buffers] != before
