"""Boolean arguments of the ensembles take a bool (or a numpy bool) and nothing else: ``"yes"``,
``1``, ``"False"`` (truthy in TorchRL) or ``None`` raise a ``TypeError`` naming the argument
before anything changes (no member writer is emptied, no member buffer is shared)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tdreplay.core import ListStorage, RandomSampler, ReplayBuffer, RoundRobinWriter, testing
from tdreplay.core.testing import assert_same, buffer_snapshot
from tdreplay.ensembles import ReplayBufferEnsemble, SamplerEnsemble, WriterEnsemble

BAD = testing.NOT_BOOLS
GOOD = testing.BOOLS


def buffers() -> tuple[ReplayBuffer, ReplayBuffer]:
    rbs = (ReplayBuffer(storage=ListStorage(8)), ReplayBuffer(storage=ListStorage(8)))
    rbs[0].extend(list(range(4)))
    rbs[1].extend(list(range(10, 13)))
    return rbs


@pytest.mark.parametrize("value", BAD)
def test_sampler_ensemble_refuses_a_sample_from_all_that_is_not_a_bool(value):
    with pytest.raises(TypeError, match="sample_from_all must be a bool, got"):
        SamplerEnsemble(RandomSampler(), RandomSampler(), sample_from_all=value)
    with pytest.raises(TypeError, match="sample_from_all must be a bool, got"):
        ReplayBufferEnsemble(*buffers(), sample_from_all=value)


@pytest.mark.parametrize("value", GOOD)
def test_sample_from_all_takes_bools_and_numpy_bools(value):
    sampler = SamplerEnsemble(RandomSampler(), RandomSampler(), sample_from_all=value)
    assert sampler.sample_from_all is bool(value)
    out = []
    for flag in (value, bool(value)):
        rb = ReplayBufferEnsemble(*buffers(), sample_from_all=flag, batch_size=4)
        torch.manual_seed(0)
        out.append(rb.sample())
    assert out[0] == out[1]


@pytest.mark.parametrize("value", BAD)
def test_pin_memory_is_refused_when_not_a_bool(value):
    with pytest.raises(TypeError, match="pin_memory must be a bool, got"):
        ReplayBufferEnsemble(*buffers(), pin_memory=value)


@pytest.mark.parametrize("value", BAD)
def test_writer_ensemble_empty_refuses_a_flag_that_is_not_a_bool(value):
    rbs = buffers()
    rb = ReplayBufferEnsemble(*rbs)
    before = [buffer_snapshot(member) for member in rbs]
    with pytest.raises(TypeError, match="empty_write_count must be a bool, got"):
        rb.writer.empty(value)
    with pytest.raises(TypeError, match="empty_write_count must be a bool, got"):
        rb.empty(value)
    for member, state in zip(rbs, before):
        assert_same(buffer_snapshot(member), state, "member buffer state")


@pytest.mark.parametrize("value", GOOD)
def test_writer_ensemble_empty_takes_bools_and_numpy_bools(value):
    writers = WriterEnsemble(RoundRobinWriter(), RoundRobinWriter())
    for writer in writers.writers:
        writer.write_count = 3
    writers.empty(value)
    assert [w.write_count for w in writers.writers] == ([0, 0] if value else [3, 3])


@pytest.mark.parametrize("value", BAD)
def test_share_refuses_a_flag_that_is_not_a_bool(value):
    rbs = buffers()
    rb = ReplayBufferEnsemble(*rbs)
    with pytest.raises(TypeError, match="shared must be a bool, got"):
        rb.share(value)
    assert not rb.shared and not any(member.shared for member in rbs)


@pytest.mark.parametrize("value", [np.bool_(True), np.bool_(False)])
def test_share_takes_numpy_bools(value):
    rbs = buffers()
    rb = ReplayBufferEnsemble(*rbs)
    rb.share(value)
    assert rb.shared is bool(value) and all(m.shared is bool(value) for m in rbs)


@pytest.mark.parametrize("value", BAD)
def test_shared_is_refused_when_not_a_bool_and_nothing_is_shared(value):
    # TorchRL-style truthiness would share every member for shared="no"
    rbs = buffers()
    with pytest.raises(TypeError, match="shared must be a bool, got"):
        ReplayBufferEnsemble(*rbs, shared=value)
    assert not any(rb.shared for rb in rbs)


@pytest.mark.parametrize("value", BAD)
def test_sample_from_all_of_an_ensemble_built_from_components_is_a_type_error(value):
    from tdreplay.ensembles import StorageEnsemble

    with pytest.raises(TypeError, match="sample_from_all must be a bool, got"):
        ReplayBufferEnsemble(storages=StorageEnsemble(ListStorage(4), ListStorage(4)),
                             samplers=SamplerEnsemble(RandomSampler(), RandomSampler()),
                             writers=WriterEnsemble(RoundRobinWriter(), RoundRobinWriter()),
                             sample_from_all=value)
