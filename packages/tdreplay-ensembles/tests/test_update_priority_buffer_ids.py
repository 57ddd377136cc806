"""ReplayBufferEnsemble.update_priority refuses ``buffer_ids`` that would route priorities to
the wrong member: a negative id (before, -1 wrapped to the last member), a float id (before,
0.5 was truncated to member 0) or a part naming several members (before, routed by its first
id). The error names ``buffer_ids`` and no member's priorities change."""

import pytest
import torch
from tensordict import TensorDict

from tdreplay.ensembles import ReplayBufferEnsemble
from tdreplay.samplers import TensorDictPrioritizedReplayBuffer
from tdreplay.storages import LazyTensorStorage


def ensemble():
    members = [TensorDictPrioritizedReplayBuffer(alpha=1.0, beta=0.5,
                                                 storage=LazyTensorStorage(20))
               for _ in range(2)]
    for member in members:
        member.extend(TensorDict({"x": torch.arange(10.0)}, [10]))
    return ReplayBufferEnsemble(*members, sample_from_all=True, batch_size=4), members


def state(members):
    return [(m.sampler.state_dict()["priorities"].clone(), m.sampler.max_priority)
            for m in members]


def assert_same(before, after):
    assert len(before) == len(after)
    for (p0, m0), (p1, m1) in zip(before, after):
        assert torch.equal(p0, p1)
        assert m0 == m1


@pytest.mark.parametrize("ids, error", [
    (torch.tensor([[-1, -1], [1, 1]]), IndexError),
    (torch.tensor([[0, 0], [-2, -2]]), IndexError),
    (torch.tensor([[0.5, 0.5], [1.0, 1.0]]), TypeError),
    (torch.tensor([[0.0, 0.0], [1.0, 1.0]]), TypeError),
    (torch.tensor([[True, True], [False, False]]), TypeError),
    (torch.tensor([[0, 1], [1, 1]]), ValueError),
])
def test_bad_buffer_ids_are_refused_and_change_nothing(ids, error):
    rb, members = ensemble()
    index = TensorDict({"buffer_ids": ids, "index": torch.tensor([[0, 1], [2, 3]])}, [2, 2])
    before = state(members)
    with pytest.raises(error, match="buffer_ids"):
        rb.update_priority(index, torch.full((2, 2), 50.0))
    assert_same(before, state(members))


def test_a_list_index_with_a_negative_id_is_refused():
    rb, members = ensemble()
    parts = [TensorDict({"buffer_ids": torch.tensor([0, 0]), "index": torch.tensor([0, 1])}, [2]),
             TensorDict({"buffer_ids": torch.tensor([-1, -1]), "index": torch.tensor([2, 3])},
                        [2])]
    before = state(members)
    with pytest.raises(IndexError, match="buffer_ids"):
        rb.update_priority(parts, [torch.full((2,), 50.0), torch.full((2,), 50.0)])
    assert_same(before, state(members))


def test_a_valid_index_still_updates_its_members():
    rb, members = ensemble()
    index = TensorDict({"buffer_ids": torch.tensor([[0, 0], [1, 1]]),
                        "index": torch.tensor([[0, 1], [2, 3]])}, [2, 2])
    rb.update_priority(index, torch.tensor([[50.0, 50.0], [7.0, 7.0]]))
    (p0, _), (p1, _) = state(members)
    assert torch.allclose(p0[:4], torch.tensor([50.0, 50.0, 1.0, 1.0], dtype=p0.dtype))
    assert torch.allclose(p1[:4], torch.tensor([1.0, 1.0, 7.0, 7.0], dtype=p1.dtype))


@pytest.mark.parametrize("ids, error", [
    (torch.tensor([[-1, -1], [1, 1]]), IndexError),
    (torch.tensor([[0.5, 0.5], [1.0, 1.0]]), TypeError),
    (torch.tensor([[0, 1], [1, 1]]), ValueError),
])
def test_the_sampler_ensemble_called_directly_refuses_them_too(ids, error):
    rb, members = ensemble()
    index = TensorDict({"buffer_ids": ids, "index": torch.tensor([[0, 1], [2, 3]])}, [2, 2])
    before = state(members)
    with pytest.raises(error, match="buffer_ids"):
        rb.sampler.update_priority(index, torch.full((2, 2), 50.0))
    assert_same(before, state(members))


def test_an_empty_part_updates_nothing_and_the_others_are_updated():
    rb, members = ensemble()
    parts = [TensorDict({"buffer_ids": torch.tensor([1]), "index": torch.tensor([3])}, [1]),
             TensorDict({"buffer_ids": torch.zeros(0, dtype=torch.long),
                         "index": torch.zeros(0, dtype=torch.long)}, [0])]
    rb.update_priority(parts, [torch.tensor([9.0]), torch.zeros(0)])
    (p0, _), (p1, _) = state(members)
    assert torch.allclose(p0[:4], torch.ones(4, dtype=p0.dtype))
    assert torch.allclose(p1[:4], torch.tensor([1.0, 1.0, 1.0, 9.0], dtype=p1.dtype))
