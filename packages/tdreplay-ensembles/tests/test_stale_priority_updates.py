"""An ensemble's priority updates skip the rows a member overwrote since the sample, as a
prioritized buffer's own do: ``update_priority(..., write_generation=sample["write_generation"])``
and ``update_tensordict_priority(sample)`` (which the ensemble lacked) route the sample's write
generations to the members (the new rows got the priorities computed for the rows they
replaced: a member's total went 4 -> 400)."""

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ListStorage, ReplayBuffer, TensorDictReplayBuffer
from tdreplay.ensembles import ReplayBufferEnsemble
from tdreplay.samplers import TensorDictPrioritizedReplayBuffer
from tdreplay.storages import LazyTensorStorage


def _members():
    members = [TensorDictPrioritizedReplayBuffer(alpha=1.0, beta=0.4,
                                                 storage=LazyTensorStorage(4))
               for _ in range(2)]
    for value, member in enumerate(members):
        member.extend(TensorDict({"x": torch.full((4,), float(value))}, [4]))
    return members


def _totals(members):
    return [round(m.sampler.total_priority, 3) for m in members]


def _updated(sample, part):
    """The total of a member of 4 rows of priority 1 once its rows drawn in ``part`` of the
    sample are set to 100."""
    drawn = len(set(sample["index", "index"][part].tolist()))
    return 100.0 * drawn + (4 - drawn)


def _update_to_100(rb, sample, how):
    """Set the sampled rows' priorities to 100 with the sample's write generations, through
    ``update_priority`` or ``update_tensordict_priority``."""
    if how == "update_priority":
        rb.update_priority(sample["index"], torch.full(sample.shape, 100.0),
                           write_generation=sample["write_generation"])
    else:
        sample["td_error"] = torch.full(sample.shape, 100.0)
        rb.update_tensordict_priority(sample)


@pytest.mark.parametrize("how", ["update_priority", "update_tensordict_priority"])
def test_rows_overwritten_since_the_sample_keep_their_priority(how):
    members = _members()
    rb = ReplayBufferEnsemble(*members, sample_from_all=True, batch_size=8)
    sample = rb.sample()
    members[1].extend(TensorDict({"x": torch.full((4,), 9.0)}, [4]))  # every row of member 1
    _update_to_100(rb, sample, how)
    # member 0's drawn rows updated, member 1's new rows kept
    assert _totals(members) == [_updated(sample, 0), 4.0]


def test_without_write_generations_every_row_is_updated_as_before():
    members = _members()
    rb = ReplayBufferEnsemble(*members, sample_from_all=True, batch_size=8)
    sample = rb.sample()
    members[1].extend(TensorDict({"x": torch.full((4,), 9.0)}, [4]))
    rb.update_priority(sample["index"], torch.full(sample.shape, 100.0))
    assert _totals(members) == [_updated(sample, 0), _updated(sample, 1)]


def test_a_write_generation_of_another_shape_updates_no_member():
    members = _members()
    rb = ReplayBufferEnsemble(*members, sample_from_all=True, batch_size=8)
    sample = rb.sample()
    with pytest.raises(ValueError, match=r"write_generation must have the index's shape \(2, 4\)"):
        rb.update_priority(sample["index"], torch.full(sample.shape, 100.0),
                           write_generation=sample["write_generation"][:1])
    assert _totals(members) == [4.0, 4.0]


def test_update_tensordict_priority_names_what_is_missing():
    members = _members()
    rb = ReplayBufferEnsemble(*members, sample_from_all=True, batch_size=8)
    sample = rb.sample()
    with pytest.raises(KeyError, match=r"needs \['td_error'\]"):
        rb.update_tensordict_priority(sample)
    plain = ReplayBufferEnsemble(ReplayBuffer(storage=ListStorage(4)), members[0])
    with pytest.raises(TypeError, match="share one priority_key"):
        plain.update_tensordict_priority(sample)
    assert _totals(members) == [4.0, 4.0]


def _prioritized_and_uniform():
    """A prioritized member, a uniform one, their ensemble and a sample of it."""
    prioritized = _members()[0]
    uniform = TensorDictReplayBuffer(storage=LazyTensorStorage(4))
    uniform.extend(TensorDict({"x": torch.ones(4)}, [4]))
    rb = ReplayBufferEnsemble(prioritized, uniform, sample_from_all=True, batch_size=8)
    return prioritized, uniform, rb, rb.sample()


def test_a_mixed_ensemble_carries_the_prioritized_members_write_generations():
    # (a uniform member gives none: the merged info was a list, the sample had no
    # "write_generation", and the prioritized member's new rows took the stale priorities)
    prioritized, _, rb, sample = _prioritized_and_uniform()
    assert sample["write_generation"].shape == (2, 4)
    assert (sample["write_generation"][1] == -1).all()  # the uniform part: none
    prioritized.extend(TensorDict({"x": torch.full((4,), 9.0)}, [4]))  # every row
    sample["td_error"] = torch.full(sample.shape, 100.0)
    rb.update_tensordict_priority(sample)
    assert round(prioritized.sampler.total_priority, 3) == 4.0


def test_update_tensordict_priority_takes_a_trailing_unit_dim_as_members_do():
    members = _members()
    rb = ReplayBufferEnsemble(*members, sample_from_all=True, batch_size=8)
    sample = rb.sample()
    sample["td_error"] = torch.full((*sample.shape, 1), 100.0)
    rb.update_tensordict_priority(sample)
    assert _totals(members) == [_updated(sample, 0), _updated(sample, 1)]


@pytest.mark.parametrize("how", ["update_priority", "update_tensordict_priority"])
def test_rows_of_a_member_emptied_and_refilled_since_the_sample_are_skipped(how):
    # the whole update raised IndexError ("not among its 2 written slots") and the other
    # member's priorities were lost with it; a buffer's own update skips such rows
    members = _members()
    rb = ReplayBufferEnsemble(*members, sample_from_all=True, batch_size=8)
    sample = rb.sample()
    members[1].empty()
    members[1].extend(TensorDict({"x": torch.full((2,), 9.0)}, [2]))  # rows 0, 1 anew
    _update_to_100(rb, sample, how)
    assert _totals(members) == [_updated(sample, 0), 2.0]  # member 1's new rows kept


def test_a_uniform_member_emptied_since_the_sample_does_not_refuse_the_update():
    prioritized, uniform, rb, sample = _prioritized_and_uniform()
    uniform.empty()
    uniform.extend(TensorDict({"x": torch.ones(1)}, [1]))
    rb.update_priority(sample["index"], torch.full(sample.shape, 100.0))
    assert round(prioritized.sampler.total_priority, 3) == _updated(sample, 0)
