"""Bad input: an early, clear error naming the argument, and the buffer left exactly as it was."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import (
    ListStorage,
    RandomSampler,
    ReplayBuffer,
    RoundRobinWriter,
    TensorDictReplayBuffer,
)


@pytest.mark.parametrize(
    "kwargs, error, name",
    [
        ({"batch_size": "3"}, TypeError, "batch_size"),
        ({"batch_size": 2.0}, TypeError, "batch_size"),
        ({"batch_size": True}, TypeError, "batch_size"),
        ({"batch_size": 0}, ValueError, "batch_size"),
        ({"storage": [1, 2]}, TypeError, "storage"),
        ({"storage": RandomSampler()}, TypeError, "storage"),
        ({"sampler": "uniform"}, TypeError, "sampler"),
        ({"sampler": ListStorage(3)}, TypeError, "sampler"),
        ({"writer": object()}, TypeError, "writer"),
        ({"prefetch": "2"}, TypeError, "prefetch"),
        ({"prefetch": -2}, ValueError, "prefetch"),
        ({"collate_fn": 3}, TypeError, "collate_fn"),
        ({"transform": 3}, TypeError, "transform"),
        ({"generator": 0}, TypeError, "generator"),
    ],
)
def test_constructor_argument_types(kwargs, error, name):
    with pytest.raises(error, match=name):
        ReplayBuffer(**kwargs)


@pytest.mark.parametrize("max_size", [0, -3, 2.5, "10"])
def test_list_storage_max_size(max_size):
    with pytest.raises(ValueError, match="max_size"):
        ListStorage(max_size)


@pytest.mark.parametrize("cls", [ReplayBuffer, TensorDictReplayBuffer])
def test_sampling_an_empty_buffer(cls, unchanged):
    rb = cls(storage=ListStorage(10), batch_size=2)
    with unchanged(rb), pytest.raises(RuntimeError, match="empty"):
        rb.sample()
    with unchanged(rb), pytest.raises(RuntimeError, match="empty"):
        next(iter(rb))


def test_sampling_after_empty(unchanged):
    rb = ReplayBuffer(storage=ListStorage(10), batch_size=2)
    rb.extend([torch.zeros(2)] * 3)
    rb.empty(empty_write_count=False)
    with unchanged(rb), pytest.raises(RuntimeError, match="empty"):
        rb.sample()


def test_extend_zero_dim_data(unchanged):
    rb = ReplayBuffer(storage=ListStorage(10))
    rb.extend([torch.tensor(1.0)])
    with unchanged(rb), pytest.raises(ValueError, match="add"):
        rb.extend(torch.tensor(3.0))
    with unchanged(rb), pytest.raises(ValueError, match="add"):
        rb.extend(TensorDict({"a": torch.tensor(1.0)}, []))


def test_extend_unsplittable_data_into_list_storage(unchanged):
    rb = ReplayBuffer(storage=ListStorage(10))
    rb.extend([torch.tensor(1.0)])
    with unchanged(rb), pytest.raises(TypeError, match="ListStorage"):
        rb.extend({"a": torch.zeros(3)})
    with unchanged(rb), pytest.raises(TypeError, match="tuple"):
        rb.extend((torch.zeros(3),))


def test_index_assignment_of_wrong_length(unchanged):
    rb = ReplayBuffer(storage=ListStorage(10))
    rb.extend([torch.tensor(float(i)) for i in range(4)])
    with unchanged(rb), pytest.raises(ValueError, match="3 items for 2 rows"):
        rb[torch.tensor([0, 1])] = [torch.tensor(0.0)] * 3
    with unchanged(rb), pytest.raises(TypeError, match="index"):
        rb[torch.tensor([0.5])] = [torch.tensor(0.0)]


def test_reading_unwritten_slots():
    rb = ReplayBuffer(storage=ListStorage(10))
    rb.extend([torch.tensor(1.0)] * 3)
    with pytest.raises(IndexError, match="not written"):
        rb[3]
    with pytest.raises(IndexError, match=r"slots must lie in \[-3, 3\) \(the written slots\)"):
        rb.storage.get(torch.tensor([0, 5]))


def test_writer_without_storage():
    with pytest.raises(RuntimeError, match="register_storage"):
        RoundRobinWriter().extend([1])


def test_in_place_edits_need_a_tensor_storage(unchanged):
    rb = ReplayBuffer(storage=ListStorage(10))
    rb.extend([TensorDict({"a": torch.zeros(())}, [])] * 2)
    # (it holds TensorDicts, as objects: the message does not say it holds none)
    with unchanged(rb), pytest.raises(TypeError, match="ListStorage keeps its items as objects"):
        rb.set_("a", torch.ones(2))
    with unchanged(rb), pytest.raises(TypeError, match="TensorStorage"):
        rb.set_at_("a", torch.ones(1), torch.tensor([0]))
    with unchanged(rb), pytest.raises(TypeError, match="TensorStorage"):
        rb.update_({"a": torch.ones(2)})


@pytest.mark.parametrize("data", [[1, 2], torch.zeros(3), {"a": torch.zeros(2)}])
def test_tensordict_buffer_refuses_other_data_as_torchrl(data: object) -> None:
    # TorchRL raises ValueError, tdreplay's error is also a TypeError; the buffer is unchanged
    from tdreplay.core.utils import NotATensorDictError
    rb = TensorDictReplayBuffer(storage=ListStorage(4))
    for write in (rb.extend, rb.add):
        with pytest.raises(ValueError, match="expects a TensorDict") as info:
            write(data)
        assert isinstance(info.value, TypeError) and isinstance(info.value, NotATensorDictError)
    assert len(rb) == 0 and rb.write_count == 0


def test_extend_refuses_an_update_priority_that_is_not_a_bool(unchanged):
    rb = TensorDictReplayBuffer(storage=ListStorage(4))
    with unchanged(rb), pytest.raises(TypeError, match="update_priority must be a bool"):
        rb.extend(TensorDict({"a": torch.zeros(2)}, [2]), update_priority="yes")
