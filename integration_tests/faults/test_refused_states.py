"""A state of another buffer is refused, whether it comes from ``load_state_dict`` or from a
checkpoint: another capacity, a writer cursor outside the storage, a negative write count.
The buffer stays exactly as it was and goes on writing and sampling as before."""

from __future__ import annotations

import pytest
import torch

from tdreplay.core import CheckpointError


@pytest.fixture(params=[False, True], ids=["list", "tensordict"])
def family(request, faults):
    return faults.Family(offset=500, tensordict=request.param)


def continues_alike(faults, family, rb, version: int) -> None:
    """``rb`` (version ``version`` of ``family``) writes and samples as a fresh build does."""
    reference = family.build(version)
    faults.assert_same_state(rb, reference)
    family.advance(rb, version + 1)
    family.advance(reference, version + 1)
    faults.assert_same_state(rb, reference)


@pytest.mark.parametrize("capacity", [4, 15, 17, 64])
def test_another_capacity_is_refused(tmp_path, faults, tally, family, capacity):
    other = faults.Family(offset=family.offset, tensordict=family.tensordict, capacity=capacity)
    source = other.build(3)
    rb = family.build(2)
    before = faults.buffer_fingerprint(rb)
    with pytest.raises(ValueError, match=rf"_storage.*max_size.*{capacity}"):
        rb.load_state_dict(source.state_dict())
    faults.assert_unchanged(rb, before)
    source.dumps(tmp_path)
    with pytest.raises(CheckpointError, match=rf"max_size={capacity}.*storage\.json"):
        rb.loads(tmp_path)
    faults.assert_unchanged(rb, before)
    continues_alike(faults, family, rb, 2)
    tally.injected("refused state (capacity)", 2)


@pytest.mark.parametrize("cursor", [999, 16, -5])
def test_cursor_out_of_range_is_refused(tmp_path, faults, tally, family, cursor):
    source = family.build(3)
    state = source.state_dict()
    state["_writer"] = {**state["_writer"], "cursor": cursor}
    rb = family.build(1)
    before = faults.buffer_fingerprint(rb)
    with pytest.raises(ValueError, match=rf"_writer.*'cursor'\] is {cursor}"):
        rb.load_state_dict(state)
    faults.assert_unchanged(rb, before)
    # the same through a checkpoint (its files intact: the writer's own check refuses it)
    source.writer.cursor = cursor
    source.dumps(tmp_path)
    with pytest.raises(CheckpointError, match=rf"'cursor'\] is {cursor}.*writer/state\.pt"):
        rb.loads(tmp_path)
    faults.assert_unchanged(rb, before)
    continues_alike(faults, family, rb, 1)
    tally.injected("refused state (cursor)", 2)


def test_negative_write_count_is_refused(faults, tally, family):
    state = family.build(3).state_dict()
    state["_writer"] = {**state["_writer"], "write_count": -1}
    rb = family.build(1)
    before = faults.buffer_fingerprint(rb)
    with pytest.raises(ValueError, match=r"_writer.*write_count"):
        rb.load_state_dict(state)
    faults.assert_unchanged(rb, before)
    tally.injected("refused state (write_count)")


def test_a_matching_state_is_accepted_and_continues(faults, family):
    rb = family.build(0)
    rb.load_state_dict(family.build(5).state_dict())
    continues_alike(faults, family, rb, 5)


def test_refused_state_leaves_sampling_alone(faults):
    """A refused load changes nothing, the generator included: the next samples are the ones
    a buffer that never saw the bad state draws."""
    family = faults.Family(offset=700)
    rb, reference = family.build(2), family.build(2)
    for b in (rb, reference):
        b.sample()
    bad = family.build(3).state_dict()
    bad["_writer"]["cursor"] = 999
    with pytest.raises(ValueError, match="cursor"):
        rb.load_state_dict(bad)
    for _ in range(3):
        assert torch.equal(rb.sample(), reference.sample())
