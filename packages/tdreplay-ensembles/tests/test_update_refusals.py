"""ReplayBufferEnsemble.update_priority checks every part before any member's sampler changes:
a bad priority or index in one part leaves every member as it was (before, the parts before the
bad one were updated, and the error said nothing was)."""

import pytest
import torch
from tensordict import TensorDict

from tdreplay.ensembles import ReplayBufferEnsemble
from tdreplay.samplers import TensorDictPrioritizedReplayBuffer
from tdreplay.storages import LazyTensorStorage


def ensemble():
    members = [TensorDictPrioritizedReplayBuffer(alpha=1.0, beta=1.0,
                                                 storage=LazyTensorStorage(10))
               for _ in range(2)]
    for member in members:
        member.extend(TensorDict({"x": torch.arange(5.0)}, [5]))
    return ReplayBufferEnsemble(*members, sample_from_all=True, batch_size=4), members


def priorities(members):
    return [m.sampler.state_dict()["priorities"].clone() for m in members]


@pytest.mark.parametrize("where", [0, 1])
def test_a_bad_priority_in_one_part_updates_no_member(where):
    rb, members = ensemble()
    index = rb.sample()["index"]
    before = priorities(members)
    priority = torch.full(index.batch_size, 5.0)
    priority[where, 0] = float("nan")
    with pytest.raises(ValueError, match="finite"):
        rb.update_priority(index, priority)
    assert all(torch.equal(a, b) for a, b in zip(priorities(members), before))
    assert [m.sampler.max_priority for m in members] == [1.0, 1.0]


def test_an_index_out_of_a_member_updates_no_member():
    rb, members = ensemble()
    index = rb.sample()["index"].clone()
    index["index"][1, 0] = 50
    before = priorities(members)
    with pytest.raises(IndexError, match="buffer 1"):
        rb.update_priority(index, torch.full(index.batch_size, 5.0))
    assert all(torch.equal(a, b) for a, b in zip(priorities(members), before))


def test_good_priorities_reach_both_members():
    rb, members = ensemble()
    index = rb.sample()["index"]
    rb.update_priority(index, torch.full(index.batch_size, 5.0))
    for member, slots in zip(members, index["index"]):
        assert member.sampler.state_dict()["priorities"][slots].tolist() == pytest.approx(
            [5.0] * slots.numel())
