"""TensorDictReplayBuffer with tensorclasses: ``index`` (or another info entry) is set where the
tensorclass has that field; without it, writes and samples still succeed and the info stays in
the info dict (a tensorclass refuses names it has no field for)."""

import pytest
import torch
from tensordict import tensorclass

from tdreplay.core import ListStorage, TensorDictReplayBuffer


@tensorclass
class Plain:
    obs: torch.Tensor


@tensorclass
class WithIndex:
    obs: torch.Tensor
    index: torch.Tensor = None


def test_extend_without_an_index_field_writes_once_and_returns_the_slots():
    rb = TensorDictReplayBuffer(storage=ListStorage(10))
    batch = Plain(obs=torch.arange(6.0).reshape(3, 2), batch_size=[3])
    assert rb.extend(batch).tolist() == [0, 1, 2]
    assert len(rb) == 3 and rb.write_count == 3
    assert rb[:].obs.tolist() == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
    assert list(batch.keys()) == ["obs"]  # nothing could be set in it: left as it was


def test_add_without_an_index_field_writes_one_item():
    rb = TensorDictReplayBuffer(storage=ListStorage(10))
    rb.extend(Plain(obs=torch.zeros(2, 2), batch_size=[2]))
    assert rb.add(Plain(obs=torch.full((2,), 7.0), batch_size=[])) == 2
    assert len(rb) == 3 and rb.write_count == 3
    assert rb[2].obs.tolist() == [7.0, 7.0]


def test_sample_without_an_index_field_keeps_the_info_in_the_info_dict():
    torch.manual_seed(0)
    rb = TensorDictReplayBuffer(storage=ListStorage(10), batch_size=4)
    rb.extend(Plain(obs=torch.arange(5.0)[:, None].expand(5, 2), batch_size=[5]))
    sample, info = rb.sample(return_info=True)
    assert type(sample) is Plain and sample.batch_size == torch.Size([4])
    assert list(sample.keys()) == ["obs"]
    assert sample.obs[:, 0].tolist() == info["index"].float().tolist()


def test_an_index_field_gets_the_slots_sampled_and_the_written_data_stays_as_it_was():
    rb = TensorDictReplayBuffer(storage=ListStorage(10), batch_size=3)
    batch = WithIndex(obs=torch.arange(4.0)[:, None], batch_size=[4])
    assert rb.extend(batch).tolist() == [0, 1, 2, 3]
    assert batch.index is None
    item = WithIndex(obs=torch.tensor([9.0]), batch_size=[])
    assert rb.add(item) == 4 and item.index is None
    sample = rb.sample()
    assert sample.obs[:, 0].tolist() == [9.0 if i == 4 else float(i) for i in sample.index]


@pytest.mark.parametrize("cls", [Plain, WithIndex])
def test_a_tensorclass_extend_is_not_refused_after_writing(cls):
    # before: a tensorclass without an ``index`` field was written, then the buffer raised
    # AttributeError setting ``index`` (a failed call that changed the buffer)
    rb = TensorDictReplayBuffer(storage=ListStorage(4))
    for _ in range(3):
        rb.extend(cls(obs=torch.ones(2, 1), batch_size=[2]))
    assert len(rb) == 4 and rb.write_count == 6
