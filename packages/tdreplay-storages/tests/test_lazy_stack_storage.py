"""LazyStackStorage: items of different shapes come back as lazy stacks."""

from __future__ import annotations

import pytest
import torch
from tensordict import LazyStackedTensorDict, TensorDict

from tdreplay.core import CheckpointError, ListStorage, ReplayBuffer, TensorDictReplayBuffer
from tdreplay.core.sample_units import Sequence
from tdreplay.storages import LazyStackStorage, LazyTensorStorage


def trajectory(length: int, value: int) -> TensorDict:
    """A trajectory of ``length`` steps; every step carries its trajectory's ``value``."""
    return TensorDict(
        {"obs": torch.full((length, 2), float(value)), "step": torch.arange(length),
         ("next", "done"): torch.arange(length)[:, None] == length - 1},
        [length],
    )


LENGTHS = [3, 5, 2, 4]


def filled(cls=ReplayBuffer, max_size: int = 10, **kwargs) -> ReplayBuffer:
    rb = cls(storage=LazyStackStorage(max_size), batch_size=3, **kwargs)
    rb.extend([trajectory(n, i) for i, n in enumerate(LENGTHS)])
    return rb


def check_items(batch: LazyStackedTensorDict, values: list[int]) -> None:
    assert isinstance(batch, LazyStackedTensorDict) and batch.stack_dim == 0
    assert len(batch.tensordicts) == len(values)
    for item, value in zip(batch.tensordicts, values):
        length = LENGTHS[value]
        assert item.batch_size == torch.Size([length])
        assert torch.equal(item["obs"], torch.full((length, 2), float(value)))
        assert item["step"].tolist() == list(range(length))


def test_heterogeneous_items_come_back_as_lazy_stacks():
    rb = filled()
    assert len(rb) == 4 and rb.write_count == 4
    everything = rb[:]
    assert everything.batch_size == torch.Size([4, -1])  # ragged second dim
    check_items(everything, [0, 1, 2, 3])
    assert rb[1].batch_size == torch.Size([5])  # one item is the TensorDict itself
    check_items(rb[torch.tensor([3, 0])], [3, 0])


def test_samples_are_lazy_stacks_of_the_sampled_items():
    rb = filled(generator=torch.Generator().manual_seed(0))
    for _ in range(5):
        batch, info = rb.sample(return_info=True)
        check_items(batch, info["index"].tolist())
        padded = batch.get("obs", as_padded_tensor=True)
        assert padded.shape == torch.Size([3, max(LENGTHS[i] for i in info["index"]), 2])


def test_wrap_around_replaces_whole_items():
    rb = ReplayBuffer(storage=LazyStackStorage(3))
    rb.extend([trajectory(n, i) for i, n in enumerate(LENGTHS)])  # 4 items, 3 slots
    stored = rb[:]
    assert [td.batch_size[0] for td in stored.tensordicts] == [4, 5, 2]
    assert stored.tensordicts[0]["obs"][0, 0] == 3.0


def test_stack_dim():
    rb = ReplayBuffer(storage=LazyStackStorage(10, stack_dim=1), batch_size=2)
    rb.extend([trajectory(3, 0), trajectory(3, 1)])
    batch = rb.sample()
    assert isinstance(batch, LazyStackedTensorDict) and batch.stack_dim == 1
    assert batch.batch_size == torch.Size([3, 2])


def test_non_tensordict_items_stay_a_list():
    rb = ReplayBuffer(storage=LazyStackStorage(10))
    rb.extend(["a", "b"])
    assert rb[:] == ["a", "b"]


def test_extend_with_a_lazy_stack_and_the_index_entry():
    rb = TensorDictReplayBuffer(storage=LazyStackStorage(10), batch_size=4)
    data = LazyStackedTensorDict.lazy_stack([trajectory(3, 0), trajectory(5, 1)])
    assert rb.extend(data).tolist() == [0, 1]
    assert all("index" not in td.keys() for td in data.tensordicts)  # the caller's data as it was
    assert "index" not in rb.storage[0].keys()  # ... and not in what is stored
    batch = rb.sample()
    for item in batch.tensordicts:
        slot = int(item["index"][0])
        assert (item["index"] == slot).all() and item.batch_size[0] == LENGTHS[slot]
        assert (item["obs"] == float(slot)).all()
    assert all("index" not in rb.storage[i].keys() for i in range(2))  # samples are copies


def test_checkpoint_round_trip(tmp_path):
    rb = filled(generator=torch.Generator().manual_seed(0))
    rb.dumps(tmp_path)
    restored = ReplayBuffer(storage=LazyStackStorage(10), batch_size=3,
                            generator=torch.Generator().manual_seed(1))
    restored.loads(tmp_path)
    check_items(restored[:], [0, 1, 2, 3])
    assert restored.write_count == 4 and restored.writer.cursor == 4
    for _ in range(3):
        a, b = restored.sample(), rb.sample()
        assert [td["obs"][0, 0] for td in a.tensordicts] == [td["obs"][0, 0] for td in b.tensordicts]


def test_checkpoint_of_another_storage_class_is_refused(tmp_path):
    other = ReplayBuffer(storage=ListStorage(10))
    other.extend([1, 2])
    other.dumps(tmp_path)
    rb = filled()
    with pytest.raises(CheckpointError, match="ListStorage"):
        rb.loads(tmp_path)
    check_items(rb[:], [0, 1, 2, 3])
    assert rb.write_count == 4


def step(i: int) -> TensorDict:
    return TensorDict({"id": torch.tensor(i), "obs": torch.full((i % 3 + 1,), float(i))}, [])


def test_storage_reads_of_several_items_are_lazy_stacks_as_torchrl():
    storage = LazyStackStorage(10)
    storage.set(torch.arange(5), [step(i) for i in range(5)])
    index = torch.tensor([3, 1, 4])
    for batch in (storage.get(index), storage[index], storage[index.tolist()]):
        assert isinstance(batch, LazyStackedTensorDict) and batch.stack_dim == 0
        assert batch["id"].tolist() == [3, 1, 4]
        assert [td["obs"].tolist() for td in batch.tensordicts] == [[3.0], [1.0, 1.0], [4.0, 4.0]]
    block = storage[1:3]
    assert isinstance(block, LazyStackedTensorDict) and block["id"].tolist() == [1, 2]
    assert storage[7:9] == []  # nothing written there: nothing to stack
    # one item is the stored TensorDict itself, as TorchRL's storage[i]
    assert storage.get(2) is storage.items()[2] and storage[-1] is storage.items()[4]


def test_entries_set_on_a_read_stay_out_of_the_storage():
    storage = LazyStackStorage(10)
    storage.set(torch.arange(3), [step(i) for i in range(3)])
    batch = storage.get(torch.tensor([0, 2]))
    batch["index"] = torch.tensor([0, 2])
    assert all("index" not in td.keys() for td in storage.items())
    assert storage.get(torch.tensor([0, 2]))["id"].tolist() == [0, 2]


def test_reads_along_a_negative_stack_dim():
    storage = LazyStackStorage(10, stack_dim=-1)
    storage.set(torch.arange(2), [trajectory(3, 0), trajectory(3, 1)])
    batch = storage[:]
    assert batch.batch_size == torch.Size([3, 2]) and batch.stack_dim == 1
    assert batch["obs"][:, 1, 0].tolist() == [1.0, 1.0, 1.0]


def test_tensors_of_one_shape_are_stacked_other_items_stay_lists():
    storage = LazyStackStorage(10)
    storage.set(torch.arange(3), [torch.full((2,), float(i)) for i in range(3)])
    batch = storage.get(torch.tensor([2, 0]))
    assert isinstance(batch, torch.Tensor) and batch.tolist() == [[2.0, 2.0], [0.0, 0.0]]
    rb = ReplayBuffer(storage=LazyStackStorage(10), batch_size=4)
    rb.extend([torch.zeros(2), torch.zeros(3)])  # ragged tensors: a list, as a ListStorage reads
    assert [t.shape[0] for t in rb.storage[:]] == [2, 3]
    # an item that is itself a list comes back whole, never stacked
    items = LazyStackStorage(4)
    items.set(0, [torch.zeros(2), torch.ones(2)])
    assert isinstance(items.get(0), list) and len(items[0]) == 2


def test_rows_out_of_range_are_refused_naming_this_storage():
    from tdreplay.core import StorageIndexError

    s = LazyStackStorage(4)
    s.set([0, 1], TensorDict({"a": torch.zeros(2, 3)}, [2]))
    with pytest.raises(StorageIndexError, match=r"rows \[7\] out of range for a LazyStackStorage"):
        s.set(7, TensorDict({"a": torch.ones(3)}, []))
    assert len(s) == 2
    assert (s.get(1)["a"] == 0).all()


def test_a_sequence_sample_unit_reads_a_lazy_stack_of_steps_as_a_tensor_storage():
    # it refused the storage ("needs a TensorDict-backed TensorStorage"): its shape was None
    done = torch.zeros(10, 1, dtype=torch.bool)
    done[4] = done[9] = True
    steps = TensorDict({"obs": torch.arange(10.0), ("next", "done"): done}, [10])
    drawn = []
    for storage in (LazyStackStorage(20), LazyTensorStorage(20)):
        rb = TensorDictReplayBuffer(storage=storage, batch_size=4,
                                    sample_unit=Sequence(length=2))
        rb.extend(steps)
        torch.manual_seed(0)
        drawn.append(rb.sample()["obs"].tolist())
    assert drawn[0] == drawn[1]
    assert all(a // 5 == b // 5 for a, b in zip(drawn[0][::2], drawn[0][1::2]))  # one episode
