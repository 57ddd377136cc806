"""``TensorDictRoundRobinWriter`` with items that have batch dims of their own.

An item of batch ``[2]`` (``extend`` of a ``[B, 2]`` TensorDict into a storage of ``ndim == 1``,
``add`` of a ``[2]`` one) gets its slot over all its dims, as TorchRL's writer
(``expand_as_right``): the stored ``index`` of item ``i`` is ``[i, i]``. In a storage of
``ndim == 2`` each step of a row already gets its own slot; the item dims after the storage's
take that slot too. Index assignment (``rb[i] = value``) stamps the same way.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ListStorage, TensorDictReplayBuffer
from tdreplay.storages import LazyMemmapStorage, LazyStackStorage, LazyTensorStorage
from tdreplay.writers import TensorDictRoundRobinWriter

_STORAGES = {
    "list": ListStorage,
    "lazy": LazyTensorStorage,
    "memmap": LazyMemmapStorage,
    "stack": LazyStackStorage,
}

pytestmark = pytest.mark.filterwarnings("ignore:Using `add\\(\\)` with a TensorDict:UserWarning")


def _rb(storage: str, capacity: int, compilable: bool = False, **kwargs):
    return TensorDictReplayBuffer(storage=_STORAGES[storage](capacity), batch_size=3,
                                  writer=TensorDictRoundRobinWriter(compilable=compilable),
                                  generator=torch.Generator().manual_seed(0), **kwargs)


def _stored(rb) -> TensorDict:
    data = rb[:]
    return torch.stack(data) if isinstance(data, list) else data


def _items(ids, dims=(2,)) -> TensorDict:
    """One item per id, of batch ``dims``, ``x`` filled with the id."""
    ids = torch.as_tensor(ids, dtype=torch.float32)
    x = ids.reshape(-1, *[1] * len(dims)).expand(-1, *dims).clone()
    return TensorDict({"x": x}, [ids.numel(), *dims])


@pytest.mark.parametrize("compilable", [False, True])
@pytest.mark.parametrize("storage", sorted(_STORAGES))
def test_extend_and_add_stamp_each_item_slot_over_its_dims(storage, compilable):
    # findings' repro_09: TorchRL returns [0, 1, 2], then 3; stored index [[0, 0], ...]
    rb = _rb(storage, 8, compilable)
    batch = _items([10, 11, 12])
    assert rb.extend(batch).tolist() == [0, 1, 2]
    item = _items([13])[0]
    assert rb.add(item) == 3
    assert "index" not in batch.keys() and "index" not in item.keys()  # the caller's as given
    stored = _stored(rb)
    assert stored["index"].tolist() == [[0, 0], [1, 1], [2, 2], [3, 3]]
    assert stored["x"][:, 0].tolist() == [10.0, 11.0, 12.0, 13.0]
    assert len(rb) == 4 and rb.write_count == 4


@pytest.mark.parametrize("storage", sorted(_STORAGES))
def test_wrapping_around_stamps_the_rows_written(storage):
    rb = _rb(storage, 3)
    assert rb.extend(_items([0, 1])).tolist() == [0, 1]
    assert rb.extend(_items([2, 3, 4, 5])).tolist() == [2, 0, 1, 2]
    stored = _stored(rb)
    assert stored["x"][:, 0].tolist() == [3.0, 4.0, 5.0]
    assert stored["index"].tolist() == [[0, 0], [1, 1], [2, 2]]
    assert rb.write_count == 6 and rb.writer.cursor == 0


def test_items_with_several_dims_of_their_own():
    rb = _rb("lazy", 4)
    assert rb.extend(_items([0, 1], dims=(2, 3))).tolist() == [0, 1]
    assert rb.add(_items([2], dims=(2, 3))[0]) == 2
    index = _stored(rb)["index"]
    assert index.shape == (3, 2, 3)
    assert index.tolist() == [[[i] * 3] * 2 for i in range(3)]


@pytest.mark.parametrize("storage", sorted(_STORAGES))
def test_samples_carry_the_slot_of_each_item(storage):
    rb = _rb(storage, 4)
    rb.extend(_items([0, 1, 2, 3]))
    sample = rb.sample()
    assert sample["index"].shape == (3, 2)
    assert torch.equal(sample["index"].float(), sample["x"])  # x holds the id = the slot


def test_write_at_stamps_the_rows_given():
    writer = TensorDictRoundRobinWriter()
    writer.register_storage(LazyTensorStorage(4))
    writer.extend(_items([0, 1, 2]))
    assert writer.write_at(torch.tensor([2, 0]), _items([7, 8])).tolist() == [2, 0]
    assert writer.write_at(1, _items([9])[0]) == 1
    stored = writer.storage[:3]
    assert stored["index"].tolist() == [[0, 0], [1, 1], [2, 2]]
    assert stored["x"][:, 0].tolist() == [8.0, 9.0, 7.0]
    assert writer.write_count == 6


@pytest.mark.parametrize("storage", ["list", "lazy", "stack"])
def test_index_assignment_stamps_each_item_slot_over_its_dims(storage):
    rb = _rb(storage, 4)
    rb.extend(_items([0, 1, 2, 3]))
    rb[1] = _items([21])[0]  # one item of batch [2]
    rb[2:4] = _items([22, 23])
    rb[torch.tensor([0])] = _items([20])
    stored = _stored(rb)
    assert stored["index"].tolist() == [[0, 0], [1, 1], [2, 2], [3, 3]]
    assert stored["x"][:, 0].tolist() == [20.0, 21.0, 22.0, 23.0]
    assert rb.write_count == 4  # (an assignment is not a write of the writer)


def test_index_assignment_whose_items_do_not_match_the_slots_is_refused():
    rb = _rb("lazy", 4)
    rb.extend(_items([0, 1, 2, 3]))
    rb[0] = _items([4])[0]  # one item for one slot: stamped [0, 0]
    before = _stored(rb).clone()
    assert before["index"][0].tolist() == [0, 0] and before["x"][0].tolist() == [4.0, 4.0]
    with pytest.raises(ValueError, match="value"):
        rb[0:2] = _items([5, 6, 7])  # 3 items for 2 slots
    assert (_stored(rb) == before).all()


@pytest.mark.parametrize("storage", [LazyTensorStorage, LazyMemmapStorage])
def test_ndim2_storage_stamps_each_step_slot_over_the_item_dims(storage):
    # rows of 3 steps (dim_extend=0); each step is an item of batch [2]
    rb = TensorDictReplayBuffer(storage=storage(12, ndim=2), dim_extend=0, batch_size=2,
                                writer=TensorDictRoundRobinWriter())
    data = TensorDict({"x": torch.zeros(2, 3, 2)}, [2, 3, 2])
    rows = rb.extend(data)
    assert rows.tolist() == [[0, 1, 2], [3, 4, 5]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        assert rb.add(data[0]).tolist() == [6, 7, 8]
    index = rb.storage[:3]["index"]
    assert index.tolist() == [[[s, s] for s in range(3 * r, 3 * r + 3)] for r in range(3)]
    assert rb.write_count == 3


def test_ndim2_storage_extended_along_time_stamps_each_slot_over_the_item_dims():
    # default dim_extend (1): a [envs=2, T=3, 2] batch fills 3 rows of 2 envs
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(12, ndim=2), batch_size=2,
                                writer=TensorDictRoundRobinWriter())
    slots = rb.extend(TensorDict({"x": torch.zeros(2, 3, 2)}, [2, 3, 2]))
    assert slots.tolist() == [[0, 2, 4], [1, 3, 5]]
    index = rb.storage[:3]["index"]  # [T, envs, 2]
    assert index.tolist() == [[[2 * t + e] * 2 for e in range(2)] for t in range(3)]
