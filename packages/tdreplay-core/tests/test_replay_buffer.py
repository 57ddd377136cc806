"""ReplayBuffer with the core defaults (ListStorage, RandomSampler, RoundRobinWriter)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
from tensordict import LazyStackedTensorDict, TensorDict

from tdreplay.core import (
    ListStorage,
    RandomSampler,
    ReplayBuffer,
    RoundRobinWriter,
    Sampler,
    Storage,
    TensorDictReplayBuffer,
)


def scalars(start: int, stop: int) -> list[torch.Tensor]:
    return [torch.tensor(float(i)) for i in range(start, stop)]


def values(rb: ReplayBuffer) -> list[float]:
    return [float(x) for x in rb[:]]


class RecordingSampler(RandomSampler):
    """A RandomSampler that records what the buffer tells it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[int]]] = []

    def extend(self, slots: torch.Tensor) -> None:
        self.calls.append(("extend", slots.tolist()))

    def mark_update(self, slots: torch.Tensor) -> None:
        self.calls.append(("update", slots.tolist()))


class EpochSampler(Sampler):
    """A minimal sampler without replacement (storage order), to test the iteration contract."""

    finite_epochs = True

    def __init__(self) -> None:
        self.pos = 0
        self._ran_out = False

    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict[str, Any]]:
        n = len(storage)
        if self.pos >= n:
            self.pos = 0
        index = torch.arange(self.pos, min(self.pos + batch_size, n))
        self.pos += index.numel()
        self._ran_out = self.pos >= n
        return index, {}

    @property
    def ran_out(self) -> bool:
        return self._ran_out

    def state_dict(self) -> dict[str, Any]:
        return {"pos": self.pos}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.pos = state_dict["pos"]


# ---- defaults ----------------------------------------------------------------------------------
def test_bare_buffer_defaults():
    rb = ReplayBuffer()
    assert type(rb.storage) is ListStorage and rb.storage.max_size == 1000
    assert type(rb.sampler) is RandomSampler
    assert type(rb.writer) is RoundRobinWriter
    assert rb.batch_size is None and len(rb) == 0 and rb.write_count == 0
    assert rb.writer.storage is rb.storage
    assert len(rb.transform) == 0


def test_sample_without_batch_size_raises():
    rb = ReplayBuffer()
    rb.extend(scalars(0, 3))
    with pytest.raises(RuntimeError, match="batch_size"):
        rb.sample()


# ---- add / extend ------------------------------------------------------------------------------
def test_add_returns_consecutive_slots_and_stores_objects_as_is():
    rb = ReplayBuffer(storage=ListStorage(4))
    obj = {"any": "python object"}
    assert rb.add(obj) == 0
    assert rb.add("b") == 1
    assert rb.add((1, 2)) == 2  # a tuple given to add is one item
    assert rb[0] is obj and rb[1] == "b" and rb[2] == (1, 2)
    assert len(rb) == 3 and rb.write_count == 3 and rb.writer.cursor == 3


def test_extend_list_is_many_items():
    rb = ReplayBuffer(storage=ListStorage(10))
    slots = rb.extend(["a", "b", "c"])
    assert slots.dtype == torch.long and slots.tolist() == [0, 1, 2]
    assert rb[:] == ["a", "b", "c"]  # strings are not stackable: a list comes back
    assert rb.extend(["d"]).tolist() == [3]
    assert len(rb) == 4 and rb.write_count == 4


def test_extend_tuple_is_refused_by_list_storage(unchanged):
    rb = ReplayBuffer(storage=ListStorage(10))
    rb.extend(scalars(0, 2))
    with unchanged(rb), pytest.raises(TypeError, match="tuple.*ListStorage"):
        rb.extend((torch.zeros(3), torch.ones(3)))


def test_extend_tensordict_is_a_batch():
    rb = ReplayBuffer(storage=ListStorage(10))
    td = TensorDict({"a": torch.arange(4), ("n", "b"): torch.arange(8.).reshape(4, 2)}, [4])
    assert rb.extend(td).tolist() == [0, 1, 2, 3]
    assert len(rb) == 4
    item = rb[2]
    assert item.batch_size == torch.Size([]) and item["a"] == 2
    assert item["n", "b"].tolist() == [4.0, 5.0]
    stacked = rb[:]
    assert stacked.batch_size == torch.Size([4])
    assert torch.equal(stacked["a"], td["a"]) and torch.equal(stacked["n", "b"], td["n", "b"])


def test_extend_tensor_is_a_batch_along_dim0():
    rb = ReplayBuffer(storage=ListStorage(10))
    data = torch.arange(12, dtype=torch.int16).reshape(3, 4)
    assert rb.extend(data).tolist() == [0, 1, 2]
    assert torch.equal(rb[1], data[1])
    assert rb[:].dtype == torch.int16 and torch.equal(rb[:], data)


def test_extend_empty_list_changes_nothing(unchanged):
    rb = ReplayBuffer(storage=ListStorage(5))
    rb.extend(scalars(0, 2))
    with unchanged(rb):
        slots = rb.extend([])
    assert slots.numel() == 0 and slots.dtype == torch.long


def test_wrap_around():
    rb = ReplayBuffer(storage=ListStorage(5))
    assert rb.extend(scalars(0, 3)).tolist() == [0, 1, 2]
    assert rb.extend(scalars(3, 7)).tolist() == [3, 4, 0, 1]
    assert values(rb) == [5, 6, 2, 3, 4]
    assert len(rb) == 5 and rb.write_count == 7 and rb.writer.cursor == 2
    assert rb.add(torch.tensor(7.0)) == 2
    assert values(rb) == [5, 6, 7, 3, 4]


def test_extend_larger_than_capacity_keeps_last_items():
    rb = ReplayBuffer(storage=ListStorage(3))
    rb.extend(scalars(0, 1))
    slots = rb.extend(scalars(1, 6))  # 5 items into 3 slots, cursor at 1
    assert slots.tolist() == [1, 2, 0, 1, 2]
    assert values(rb) == [3, 4, 5]
    assert rb.write_count == 6 and rb.writer.cursor == 0


def test_extend_larger_than_capacity_on_fresh_buffer():
    rb = ReplayBuffer(storage=ListStorage(3))
    assert rb.extend(scalars(0, 5)).tolist() == [0, 1, 2, 0, 1]
    assert values(rb) == [3, 4, 2]
    assert len(rb) == 3 and rb.writer.cursor == 2


# ---- indexing ----------------------------------------------------------------------------------
def test_getitem_forms():
    rb = ReplayBuffer(storage=ListStorage(10))
    rb.extend(scalars(0, 6))
    assert float(rb[2]) == 2 and float(rb[-1]) == 5
    assert torch.equal(rb[:], torch.arange(6.0))
    assert torch.equal(rb[1:3], torch.tensor([1.0, 2.0]))
    assert torch.equal(rb[torch.tensor([4, 0, 4])], torch.tensor([4.0, 0.0, 4.0]))
    with pytest.raises(IndexError):
        rb[torch.tensor([6])]


def test_setitem_tensor_index_overwrites_and_tells_sampler():
    sampler = RecordingSampler()
    rb = ReplayBuffer(storage=ListStorage(10), sampler=sampler)
    rb.extend(scalars(0, 5))
    rb[torch.tensor([1, 3])] = torch.tensor([10.0, 30.0])
    assert values(rb) == [0, 10, 2, 30, 4]
    assert sampler.calls == [("extend", [0, 1, 2, 3, 4]), ("update", [1, 3])]
    assert len(rb) == 5 and rb.write_count == 5 and rb.writer.cursor == 5


def test_setitem_int_slice_and_negative_follow_reads():
    sampler = RecordingSampler()
    rb = ReplayBuffer(storage=ListStorage(10), sampler=sampler)
    rb.extend(scalars(0, 4))
    rb[-1] = torch.tensor(9.0)  # the last *written* row, as rb[-1] reads
    assert float(rb[-1]) == 9 and values(rb) == [0, 1, 2, 9]
    assert sampler.calls[-1] == ("update", [3])
    rb[:] = rb[:] * 2
    assert values(rb) == [0, 2, 4, 18]
    rb[1:3] = [torch.tensor(-1.0), torch.tensor(-2.0)]
    assert values(rb) == [0, -1, -2, 18] and sampler.calls[-1] == ("update", [1, 2])
    assert len(rb) == 4 and rb.write_count == 4


def test_add_tells_a_sampler_that_follows_writes_and_returns_the_int_slot(monkeypatch):
    sampler = RecordingSampler()
    rb = ReplayBuffer(storage=ListStorage(3), sampler=sampler)
    slots = [rb.add(torch.tensor(float(i))) for i in range(4)]  # the 4th wraps onto slot 0
    assert slots == [0, 1, 2, 0] and all(type(s) is int for s in slots)
    assert sampler.calls == [("extend", [0]), ("extend", [1]), ("extend", [2]), ("extend", [0])]
    assert values(rb) == [3, 1, 2] and rb.write_count == 4
    # a sampler keeping the base's extend needs no notice: add builds no tensor for it
    made = []
    real_as_tensor = torch.as_tensor
    monkeypatch.setattr(torch, "as_tensor", lambda *a, **k: made.append(a) or
                        real_as_tensor(*a, **k))
    plain = ReplayBuffer(storage=ListStorage(3))
    assert plain.add(torch.tensor(5.0)) == 0 and made == []
    assert float(plain.sample(1)[0]) == 5.0


def test_extend_returns_int64_slots_that_own_their_memory():
    rb = ReplayBuffer(storage=ListStorage(4))
    first = rb.extend(scalars(0, 3))
    assert first.dtype is torch.int64 and first.tolist() == [0, 1, 2]
    first += 10  # the caller's tensor: the next extend's slots are not affected
    second = rb.extend(scalars(3, 6))  # wraps: rows 3, 0, 1
    assert second.dtype is torch.int64 and second.tolist() == [3, 0, 1]
    assert values(rb) == [4, 5, 2, 3]


def test_setitem_past_written_rows_is_refused(unchanged):
    rb = ReplayBuffer(storage=ListStorage(10))
    rb.extend(scalars(0, 4))
    with unchanged(rb), pytest.raises(IndexError, match="4 rows are written"):
        rb[5] = torch.tensor(1.0)
    with unchanged(rb), pytest.raises(IndexError, match="out of range"):
        rb[-5] = torch.tensor(1.0)
    with unchanged(rb), pytest.raises(IndexError, match="gap"):
        rb[6:8] = scalars(0, 2)
    with unchanged(rb), pytest.raises(IndexError, match="one entry per written row"):
        rb[torch.tensor([False] * 5 + [True])] = scalars(0, 1)


def test_setitem_boolean_mask():
    sampler = RecordingSampler()
    rb = ReplayBuffer(storage=ListStorage(10), sampler=sampler)
    rb.extend(scalars(0, 4))
    rb[torch.tensor([True, False, True, False])] = scalars(8, 10)
    assert values(rb) == [8, 1, 9, 3] and sampler.calls[-1] == ("update", [0, 2])


def test_read_all_in_order_and_write_all():
    rb = ReplayBuffer(storage=ListStorage(6))
    rb.extend(scalars(0, 8))  # wrapped: physical order differs from insertion order
    assert values(rb) == [6, 7, 2, 3, 4, 5]
    assert torch.equal(rb.read_all_in_order(), rb[:])
    assert torch.equal(rb.read_all_in_order(2), torch.tensor([6.0, 7.0]))
    rb.write_all(list(torch.arange(6.0) * 10))
    assert values(rb) == [0, 10, 20, 30, 40, 50]
    rb.write_all(scalars(100, 102))  # end defaults to the data's length
    assert values(rb) == [100, 101, 20, 30, 40, 50]
    rb.write_all(scalars(7, 10), end=3)
    assert values(rb)[:3] == [7, 8, 9]
    assert rb.write_count == 8 and rb.writer.cursor == 2


def test_write_all_on_empty_buffer_fills_it_in_physical_order():
    rb = ReplayBuffer(storage=ListStorage(6))
    rb.write_all(scalars(0, 4))
    assert values(rb) == [0, 1, 2, 3] and len(rb) == 4
    assert rb.write_count == 0  # write_count counts add/extend only


# ---- sampling ----------------------------------------------------------------------------------
def test_sample_shapes_values_and_info():
    rb = ReplayBuffer(storage=ListStorage(100), batch_size=16)
    rb.extend(scalars(0, 50))
    batch, info = rb.sample(return_info=True)
    assert batch.shape == torch.Size([16]) and batch.dtype == torch.float32
    assert set(info) == {"index"}
    assert torch.equal(batch, info["index"].float())  # item i lives at slot i
    assert int(info["index"].min()) >= 0 and int(info["index"].max()) < 50
    assert rb.sample(3).shape == torch.Size([3])


def test_sample_covers_only_written_slots():
    rb = ReplayBuffer(storage=ListStorage(1000), generator=torch.Generator().manual_seed(0))
    rb.extend(scalars(0, 5))
    seen = torch.cat([rb.sample(64) for _ in range(10)])
    assert set(seen.tolist()) == {0.0, 1.0, 2.0, 3.0, 4.0}


def test_batch_size_argument_validation():
    rb = ReplayBuffer(storage=ListStorage(10))
    rb.extend(scalars(0, 3))
    with pytest.raises(ValueError, match="batch_size"):
        rb.sample(0)
    with pytest.raises(TypeError, match="batch_size"):
        rb.sample(2.0)
    with pytest.raises(TypeError, match="batch_size"):
        rb.sample(True)


def test_iteration_is_infinite_with_random_sampler():
    rb = ReplayBuffer(storage=ListStorage(10), batch_size=3)
    rb.extend(scalars(0, 10))
    batches = list(itertools.islice(iter(rb), 25))  # more batches than items: never stops
    assert len(batches) == 25
    assert all(b.shape == torch.Size([3]) for b in batches)


def test_iteration_ends_after_an_epoch_with_finite_sampler():
    rb = ReplayBuffer(storage=ListStorage(10), sampler=EpochSampler(), batch_size=4)
    rb.extend(scalars(0, 10))
    batches = [b.tolist() for b in rb]
    assert batches == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert [b.tolist() for b in rb] == batches  # a new iteration starts a new epoch


def test_iteration_needs_batch_size():
    rb = ReplayBuffer()
    rb.extend(scalars(0, 3))
    with pytest.raises(RuntimeError, match="batch_size"):
        next(iter(rb))


def test_collate_fn_is_used_for_samples_and_reads():
    calls = []

    def collate(items):
        calls.append(len(items))
        return torch.stack(items) * 100

    rb = ReplayBuffer(storage=ListStorage(10), collate_fn=collate, batch_size=4)
    rb.extend(scalars(1, 2))
    assert rb.sample().tolist() == [100.0] * 4
    assert rb[:].tolist() == [100.0]
    assert calls == [4, 1]


def test_pin_memory_without_cuda_is_a_no_op():
    rb = ReplayBuffer(storage=ListStorage(10), pin_memory=True, batch_size=4)
    rb.extend(scalars(0, 10))
    batch = rb.sample()
    assert batch.shape == torch.Size([4])
    if not torch.cuda.is_available():
        assert not batch.is_pinned()


def test_generator_same_seed_same_samples():
    def make(seed: int) -> ReplayBuffer:
        rb = ReplayBuffer(storage=ListStorage(100), batch_size=8,
                          generator=torch.Generator().manual_seed(seed))
        rb.extend(scalars(0, 100))
        return rb

    a, b, c = make(3), make(3), make(4)
    draws_a = [a.sample().tolist() for _ in range(5)]
    assert draws_a == [b.sample().tolist() for _ in range(5)]
    assert draws_a != [c.sample().tolist() for _ in range(5)]


def test_set_rng_validates_type():
    rb = ReplayBuffer()
    with pytest.raises(TypeError, match="generator"):
        rb.set_rng(0)
    with pytest.raises(TypeError, match="generator"):
        ReplayBuffer(generator=123)


# ---- empty -------------------------------------------------------------------------------------
@pytest.mark.parametrize("empty_write_count", [True, False])
def test_empty(empty_write_count):
    rb = ReplayBuffer(storage=ListStorage(5), batch_size=2)
    rb.extend(scalars(0, 7))
    rb.empty(empty_write_count=empty_write_count)
    assert len(rb) == 0 and rb.writer.cursor == 0
    assert rb.write_count == (0 if empty_write_count else 7)
    with pytest.raises(RuntimeError, match="empty"):
        rb.sample()
    assert rb.extend(scalars(10, 12)).tolist() == [0, 1]
    assert values(rb) == [10, 11]
    assert rb.write_count == (2 if empty_write_count else 9)


def test_empty_defaults_to_resetting_write_count():
    rb = ReplayBuffer()
    rb.extend(scalars(0, 3))
    rb.empty()
    assert rb.write_count == 0


# ---- components --------------------------------------------------------------------------------
def test_set_components_return_the_previous_ones():
    rb = ReplayBuffer(storage=ListStorage(5), batch_size=2)
    old_storage, old_sampler, old_writer = rb.storage, rb.sampler, rb.writer
    new_storage = ListStorage(3)
    assert rb.set_storage(new_storage) is old_storage
    assert rb.storage is new_storage and rb.writer.storage is new_storage
    new_sampler = RecordingSampler()
    assert rb.set_sampler(new_sampler) is old_sampler and rb.sampler is new_sampler
    new_writer = RoundRobinWriter()
    assert rb.set_writer(new_writer) is old_writer and rb.writer is new_writer
    assert new_writer.storage is new_storage
    assert rb.extend(scalars(0, 4)).tolist() == [0, 1, 2, 0]  # new capacity, new writer
    assert new_sampler.calls == [("extend", [0, 1, 2, 0])]
    assert values(rb) == [3, 1, 2]


def test_set_storage_resets_collate_fn_unless_given():
    rb = ReplayBuffer(storage=ListStorage(5), collate_fn=lambda items: "custom")
    rb.extend(scalars(0, 2))
    assert rb[:] == "custom"
    rb.set_storage(ListStorage(5))
    rb.extend(scalars(0, 2))
    assert torch.equal(rb[:], torch.tensor([0.0, 1.0]))
    rb.set_storage(ListStorage(5), collate_fn=lambda items: len(items))
    rb.extend(scalars(0, 3))
    assert rb[:] == 3


def test_set_sampler_hands_over_the_generator():
    g = torch.Generator().manual_seed(0)
    rb = ReplayBuffer(storage=ListStorage(10), generator=g)
    sampler = RandomSampler()
    rb.set_sampler(sampler)
    assert sampler._rng is g


@pytest.mark.parametrize(
    "method, bad, kind",
    [("set_storage", [], "storage"), ("set_sampler", "random", "sampler"),
     ("set_writer", RandomSampler(), "writer")],
)
def test_set_components_validate_types(method, bad, kind, unchanged):
    rb = ReplayBuffer(storage=ListStorage(5))
    rb.extend(scalars(0, 2))
    before = (rb.storage, rb.sampler, rb.writer)
    with unchanged(rb), pytest.raises(TypeError, match=kind):
        getattr(rb, method)(bad)
    assert (rb.storage, rb.sampler, rb.writer) == before


def test_repr_names_components():
    text = repr(ReplayBuffer(batch_size=3))
    assert "ListStorage" in text and "RandomSampler" in text and "RoundRobinWriter" in text


# ---- TensorDictReplayBuffer ----------------------------------------------------------------
def test_tensordict_buffer_leaves_extended_data_as_it_was_and_samples_carry_the_index():
    # TorchRL 0.14.1 writes a shallow copy: the caller's TensorDict gets no "index"
    rb = TensorDictReplayBuffer(storage=ListStorage(6), batch_size=5)
    td = TensorDict({"obs": torch.arange(4.0)}, [4])
    assert rb.extend(td).tolist() == [0, 1, 2, 3]
    assert sorted(td.keys()) == ["obs"]
    td2 = TensorDict({"obs": torch.arange(4.0, 8.0)}, [4])
    assert rb.extend(td2).tolist() == [4, 5, 0, 1]  # wrapped
    assert sorted(td2.keys()) == ["obs"]
    sample, info = rb.sample(return_info=True)
    assert sample["index"].dtype == torch.long
    assert torch.equal(sample["index"], info["index"])
    expected = {0: 6.0, 1: 7.0, 2: 2.0, 3: 3.0, 4: 4.0, 5: 5.0}
    assert sample["obs"].tolist() == [expected[i] for i in sample["index"].tolist()]


def test_tensordict_buffer_does_not_store_index_of_reextended_data():
    rb = TensorDictReplayBuffer(storage=ListStorage(10))
    rb.extend(TensorDict({"obs": torch.arange(3.0)}, [3]))
    sample = rb[torch.tensor([2, 0])]
    sample["index"] = torch.tensor([2, 0])  # as a sample of these rows carries it
    assert rb.extend(sample).tolist() == [3, 4]
    assert "index" not in rb[:].keys()
    assert rb[:]["obs"].tolist() == [0.0, 1.0, 2.0, 2.0, 0.0]
    assert sample["index"].tolist() == [2, 0]  # the sample as it was


class GenerationSampler(RandomSampler):
    """A sampler with per-item bookkeeping (the write count of a slot), as a prioritized one."""

    info_keys = ("generation",)
    update_keys = ("generation",)

    def __init__(self) -> None:
        self.generation = torch.zeros(10, dtype=torch.long)

    def extend(self, slots: torch.Tensor) -> None:
        self.generation[slots] += 1

    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict[str, Any]]:
        index, _ = super().sample(storage, batch_size)
        return index, self.item_info(index)

    def item_info(self, slots: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"generation": self.generation[slots]}


def test_tensordict_buffer_reextends_a_lazy_stack_without_its_bookkeeping():
    # items of different shapes: the sample is a lazy stack with -1 in its batch size, whose
    # per-item entries ("index", the sampler's "generation") are set item by item; written
    # back, they are left out of the storage and the sample keeps the ones it was drawn with
    rb = TensorDictReplayBuffer(storage=ListStorage(10), sampler=GenerationSampler(),
                                batch_size=3, generator=torch.Generator().manual_seed(0))
    rb.extend(LazyStackedTensorDict(*[TensorDict({"x": torch.zeros(n)}, [n])
                                      for n in range(1, 5)]))
    sample = rb.sample()
    assert sample.batch_size[1] == -1
    drawn = [item["index"].unique().tolist() for item in sample.tensordicts]
    assert rb.extend(sample).tolist() == [4, 5, 6]
    assert [item["index"].unique().tolist() for item in sample.tensordicts] == drawn
    assert all(item["generation"].unique().tolist() == [1] for item in sample.tensordicts)
    assert all(set(item.keys()) == {"x"} for item in rb.storage[:])
    assert rb.sampler.generation[4:7].tolist() == [1, 1, 1]


def test_tensordict_buffer_sample_of_differently_shaped_items_leaves_them_unchanged():
    # such a sample is a lazy stack: "index" is set in each of its items, never in storage
    rb = TensorDictReplayBuffer(storage=ListStorage(10), batch_size=8,
                                generator=torch.Generator().manual_seed(0))
    rb.extend(LazyStackedTensorDict(*[TensorDict({"x": torch.zeros(n)}, [n])
                                      for n in range(1, 5)]))
    sample = rb.sample()
    drawn = [int(item["index"][0]) for item in sample.tensordicts]
    assert len(set(drawn)) < len(drawn)  # some items are drawn twice
    for item in sample.tensordicts:
        assert item["index"].unique().tolist() == [item.batch_size[0] - 1]
    assert all(set(item.keys()) == {"x"} for item in rb.storage[:])


def test_tensordict_buffer_add_leaves_the_item_as_it_was():
    rb = TensorDictReplayBuffer(storage=ListStorage(10))
    rb.extend(TensorDict({"obs": torch.arange(2.0)}, [2]))
    item = TensorDict({"obs": torch.tensor(5.0)}, [])
    assert rb.add(item) == 2
    assert sorted(item.keys()) == ["obs"]
    assert rb[2]["obs"].item() == 5.0


def test_tensordict_buffer_refuses_other_data(unchanged):
    rb = TensorDictReplayBuffer(storage=ListStorage(10))
    rb.extend(TensorDict({"obs": torch.arange(2.0)}, [2]))
    with unchanged(rb), pytest.raises(TypeError, match="TensorDict"):
        rb.extend([torch.zeros(2)])
    with unchanged(rb), pytest.raises(TypeError, match="TensorDict"):
        rb.add(torch.zeros(2))


def test_tensordict_buffer_update_priority_is_a_no_op_for_uniform_sampling(same):
    rb = TensorDictReplayBuffer(storage=ListStorage(10), batch_size=2)
    rb.extend(TensorDict({"obs": torch.arange(4.0), "td_error": torch.ones(4)}, [4]))
    state = rb.sampler.state_dict()
    sample = rb.sample()
    rb.update_tensordict_priority(sample)
    same(rb.sampler.state_dict(), state)


def test_update_priority_on_uniform_sampler_warns():
    rb = ReplayBuffer(storage=ListStorage(10))
    rb.extend(scalars(0, 3))
    with pytest.warns(UserWarning, match="not prioritized"):
        rb.update_priority(torch.tensor([0]), torch.tensor([1.0]))
