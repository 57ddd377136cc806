"""A prioritized TensorDict buffer of tensorclasses: the initial priorities are read from the
tensorclass's priority field, ``priority_weight`` goes into the sample only where the
tensorclass has that field, and updating from a sample without ``index`` says what to do."""

import pytest
import torch
from tensordict import tensorclass

from tdreplay.data import LazyTensorStorage, ListStorage, TensorDictPrioritizedReplayBuffer


@tensorclass
class Step:
    obs: torch.Tensor
    td_error: torch.Tensor = None


@tensorclass
class StepWithInfo:
    obs: torch.Tensor
    td_error: torch.Tensor = None
    index: torch.Tensor = None
    priority_weight: torch.Tensor = None


@pytest.mark.parametrize("storage", [LazyTensorStorage, ListStorage])
def test_priorities_come_from_the_field_and_info_stays_in_the_dict(storage):
    rb = TensorDictPrioritizedReplayBuffer(alpha=1.0, beta=1.0, storage=storage(8))
    rb.extend(Step(obs=torch.arange(3.0), td_error=torch.tensor([0.0, 0.0, 5.0]),
                   batch_size=[3]))
    sample, info = rb.sample(16, return_info=True)
    assert type(sample) is Step and list(sample.keys()) == ["obs", "td_error"]
    # priorities (0 + eps, 0 + eps, 5 + eps): slot 2 is nearly always drawn
    assert (info["index"] == 2).sum() >= 14
    assert sample.obs.tolist() == info["index"].float().tolist()
    assert info["priority_weight"].shape == (16,)
    with pytest.raises(KeyError, match="tensorclass"):
        rb.update_tensordict_priority(sample)
    rb.update_priority(info["index"], torch.ones(16))  # the way without an index field
    assert rb.sampler.state_dict()["priorities"][2].item() == pytest.approx(1.0)


def test_fields_for_the_info_are_filled():
    rb = TensorDictPrioritizedReplayBuffer(alpha=1.0, beta=1.0, storage=LazyTensorStorage(8))
    batch = StepWithInfo(obs=torch.arange(4.0), td_error=torch.ones(4), batch_size=[4])
    assert rb.extend(batch).tolist() == [0, 1, 2, 3]
    assert batch.index is None  # the caller's batch as it was
    sample = rb.sample(6)
    assert sample.obs.tolist() == sample.index.float().tolist()
    assert sample.priority_weight.shape == (6,)
    assert torch.allclose(sample.priority_weight, torch.ones(6))  # equal priorities
    sample.td_error = torch.full((6,), 3.0)
    rb.update_tensordict_priority(sample)
    stored = rb.sampler.state_dict()["priorities"][sample.index]
    assert stored.tolist() == pytest.approx([3.0] * 6)
