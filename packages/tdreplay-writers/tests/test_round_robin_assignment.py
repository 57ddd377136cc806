"""``rb[index] = value`` with a ``TensorDictRoundRobinWriter``: the value gets the slots it is
written at under ``"index"``, as ``extend`` gives them. Before, a value without the entry was
refused ("missing ['index']", the writer's own column, where TorchRL accepts it) and a row
copied from another (``rb[0] = rb[1]``) kept the other row's slot."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ReplayBuffer, TensorDictReplayBuffer
from tdreplay.storages import LazyTensorStorage
from tdreplay.writers import TensorDictRoundRobinWriter


def _buffer(ndim: int = 1) -> TensorDictReplayBuffer:
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8, ndim=ndim),
                                writer=TensorDictRoundRobinWriter())
    shape = [4] if ndim == 1 else [2, 2]
    rb.extend(TensorDict({"x": torch.arange(4.0).reshape(shape)}, shape))
    return rb


def test_an_item_or_a_batch_without_the_entry_gets_its_slots():
    rb = _buffer()
    rb[0] = TensorDict({"x": torch.tensor(9.0)}, [])
    rb[2:4] = TensorDict({"x": torch.tensor([7.0, 8.0])}, [2])
    assert rb[:]["x"].tolist() == [9.0, 1.0, 7.0, 8.0]
    assert rb[:]["index"].tolist() == [0, 1, 2, 3]
    rb[torch.tensor([3, 1])] = TensorDict({"x": torch.tensor([5.0, 6.0])}, [2])
    assert rb[:]["x"].tolist() == [9.0, 6.0, 7.0, 5.0]
    assert rb[:]["index"].tolist() == [0, 1, 2, 3]


def test_a_row_copied_from_another_gets_its_own_slot():
    rb = _buffer()
    rb[0] = rb[1]
    assert rb[:]["x"].tolist() == [1.0, 1.0, 2.0, 3.0]
    assert rb[:]["index"].tolist() == [0, 1, 2, 3]  # (TorchRL's keeps the 1 copied)


def test_a_two_dimensional_storage_writes_the_value_as_given():
    rb = _buffer(ndim=2)
    stamped = rb[:]["index"].tolist()  # what extend wrote
    rb[1] = TensorDict({"x": torch.tensor([5.0, 6.0])}, [2])
    assert rb[:]["x"].tolist() == [[0.0, 1.0], [5.0, 6.0]]
    assert rb[:]["index"].tolist() == stamped


def test_a_value_of_another_shape_is_still_refused_and_nothing_changes():
    rb = _buffer()
    before = rb[:].clone()
    with pytest.raises(ValueError, match="value has batch size \\[3\\], but the index covers 2"):
        rb[0:2] = TensorDict({"x": torch.zeros(3)}, [3])
    assert (rb[:] == before).all()


def test_other_writers_write_the_value_as_given():
    rb = ReplayBuffer(storage=LazyTensorStorage(4))
    rb.extend(TensorDict({"x": torch.arange(4.0)}, [4]))
    rb[1] = TensorDict({"x": torch.tensor(9.0)}, [])
    assert rb[:]["x"].tolist() == [0.0, 9.0, 2.0, 3.0] and "index" not in rb[:].keys()
