"""``compilable=True``: a ``torch.compile``'d ``extend`` + ``sample`` stops recompiling once
warmed up, and writes / samples what the default path does."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from tdreplay.core import ListStorage, RandomSampler, ReplayBuffer, RoundRobinWriter
from tdreplay.storages import LazyTensorStorage


def _buffer(capacity: int, compilable: bool) -> ReplayBuffer:
    return ReplayBuffer(storage=LazyTensorStorage(capacity, compilable=compilable),
                        sampler=RandomSampler(), writer=RoundRobinWriter(compilable=compilable),
                        batch_size=4, compilable=compilable)


@pytest.mark.parametrize("capacity", [6, 33])  # wraps around / fills over the calls
@pytest.mark.parametrize("pytree", [False, True])
def test_compiled_extend_sample_does_not_recompile(capacity: int, pytree: bool) -> None:
    torch._dynamo.reset()
    rb = _buffer(capacity, compilable=True)

    @torch.compile(backend="eager")
    def extend_and_sample(data):  # type: ignore[no-untyped-def]
        rows = rb.extend(data)
        return rows, rb.sample()

    graphs_after_warmup = None
    for call in range(10):
        value = torch.arange(3 * call, 3 * call + 3)
        data = {"a": value, "b": {"c": value.float()}} if pytree else value
        rows, sample = extend_and_sample(data)
        expected_rows = torch.arange(3 * call, 3 * call + 3) % capacity
        assert rows.tolist() == expected_rows.tolist()
        stored = rb.storage.get(expected_rows)
        stored_a = stored["a"] if pytree else stored
        assert stored_a.tolist() == value.tolist()  # the values written, at the right rows
        written = min(3 * (call + 1), capacity)
        assert len(rb) == written
        drawn = sample["a"] if pytree else sample
        assert drawn.shape == (4,)
        held = rb.storage.get(torch.arange(written))
        held_a = held["a"] if pytree else held
        assert set(drawn.tolist()) <= set(held_a.tolist())  # drawn from the written rows
        if call == 2:  # warmed up
            graphs_after_warmup = counters["stats"]["unique_graphs"]
    assert counters["stats"]["unique_graphs"] == graphs_after_warmup  # no recompile since
    assert rb.writer.cursor == 30 % capacity


def test_compilable_state_matches_default() -> None:
    plain, comp = _buffer(5, compilable=False), _buffer(5, compilable=True)
    for start in (0, 3, 6):
        for rb in (plain, comp):
            rb.extend(torch.arange(start, start + 3))
    assert comp.writer.cursor == plain.writer.cursor == 4
    assert comp.storage.last_written_row == plain.storage.last_written_row == 3
    assert len(comp) == len(plain) == 5
    assert comp.storage[:].tolist() == plain.storage[:].tolist() == [5, 6, 7, 8, 4]
    s_plain, s_comp = plain.state_dict(), comp.state_dict()
    assert s_comp["_writer"] == s_plain["_writer"] == {"cursor": 4, "write_count": 9}
    assert type(s_comp["_storage"]["len_rows"]) is int
    assert s_comp["_storage"]["len_rows"] == s_plain["_storage"]["len_rows"] == 5
    # a restored compilable buffer goes on from the same cursor and count
    restored = _buffer(5, compilable=True)
    restored.extend(torch.zeros(1, dtype=torch.long))
    restored.load_state_dict(s_plain)
    assert restored.writer.cursor == 4 and len(restored) == 5
    assert restored.extend(torch.tensor([9, 10])).tolist() == [4, 0]
    assert restored.storage[:].tolist() == [10, 6, 7, 8, 9]


def test_compilable_sampler_draws_written_slots() -> None:
    rb = _buffer(100, compilable=True)
    with pytest.raises(RuntimeError, match="empty"):
        RandomSampler().sample(rb.storage, 3)
    rb.extend(torch.arange(7) * 10)
    count = rb.storage.written_slots_tensor()
    assert count is not None and count.dtype is torch.long and int(count) == 7
    index, _ = RandomSampler().sample(rb.storage, 1000)
    assert index.dtype is torch.long and index.shape == (1000,)
    assert int(index.min()) >= 0 and int(index.max()) < 7
    assert set(index.tolist()) == set(range(7))  # every written slot comes up in 1000 draws
    rb.empty()
    assert int(rb.storage.written_slots_tensor()) == 0


def test_compilable_set_refuses_rows_out_of_range() -> None:
    storage = LazyTensorStorage(4, compilable=True)
    storage.set(torch.tensor([0, 1]), torch.tensor([1, 2]))
    storage.set(torch.tensor([-1]), torch.tensor([9]))  # counts from the rows written
    assert len(storage) == 2 and storage[:].tolist() == [1, 9]
    with pytest.raises(IndexError, match="out of range"):
        storage.set(torch.tensor([1, 4]), torch.tensor([7, 7]))
    with pytest.raises(IndexError, match="out of range"):
        storage.set(torch.tensor([-3]), torch.tensor([7]))
    assert storage[:].tolist() == [1, 9]  # unchanged
    storage.set(torch.tensor([2, 3]), torch.tensor([3, 4]))
    storage.set(torch.tensor([-1]), torch.tensor([8]))  # full: counts from the end
    assert storage[:].tolist() == [1, 9, 3, 8]


def _written_through(storage: str, capacity: int, compilable: bool) -> ReplayBuffer:
    """A buffer over a ``"list"`` or ``"tensor"`` storage, compilable or not throughout."""
    store = (ListStorage(capacity) if storage == "list"
             else LazyTensorStorage(capacity, compilable=compilable))
    return ReplayBuffer(storage=store, writer=RoundRobinWriter(compilable=compilable),
                        compilable=compilable)


@pytest.mark.parametrize("storage", ["list", "tensor"])
def test_compilable_add_writes_each_item_at_the_next_row(storage: str) -> None:
    # the cursor of a compilable writer lives in a tensor: add() used to leave it at 0, so
    # every item overwrote the last one (a buffer of one item, the others lost)
    def make(compilable: bool) -> ReplayBuffer:
        return _written_through(storage, 4, compilable)

    compiled, default = make(True), make(False)
    for i in range(6):  # wraps around the 4 rows
        item = torch.tensor([float(i)])
        assert compiled.add(item) == default.add(item) == i % 4
    assert compiled.writer.cursor == default.writer.cursor == 2
    assert compiled.write_count == default.write_count == 6
    assert len(compiled) == len(default) == 4
    assert [float(compiled[i][0]) for i in range(4)] == [4.0, 5.0, 2.0, 3.0]
    assert [float(default[i][0]) for i in range(4)] == [4.0, 5.0, 2.0, 3.0]
    # add and extend share the cursor
    assert compiled.extend(torch.tensor([[6.0], [7.0]])).tolist() == [2, 3]
    assert compiled.add(torch.tensor([8.0])) == 0


@pytest.mark.parametrize("storage", ["list", "tensor"])
@pytest.mark.parametrize("seed", range(12))
def test_compilable_buffer_follows_the_default_one_through_random_histories(storage: str,
                                                                             seed: int) -> None:
    import random

    def make(compilable: bool) -> ReplayBuffer:
        return _written_through(storage, 5, compilable)

    def seen(rb: ReplayBuffer) -> tuple:
        return (rb.writer.cursor, rb.write_count, len(rb),
                [rb[i].tolist() for i in range(len(rb))])

    rng = random.Random(seed)
    pair = [make(True), make(False)]
    for step in range(16):
        op, value = rng.choice(["add", "extend", "extend", "empty", "reload", "setitem"]), step
        if op == "add":
            assert len({rb.add(torch.tensor([float(value)])) for rb in pair}) == 1
        elif op == "extend":
            n = rng.randint(1, 7)  # more than the capacity too
            rows = [rb.extend(torch.full((n, 1), float(value))).tolist() for rb in pair]
            assert rows[0] == rows[1]
        elif op == "empty":
            for rb in pair:
                rb.empty()
        elif op == "reload":  # a restored buffer goes on where the saved one was
            restored = [make(True), make(False)]
            for old, new in zip(pair, restored):
                new.load_state_dict(old.state_dict())
            pair = restored
        elif len(pair[1]):
            for rb in pair:
                rb[0] = torch.tensor([float(value)])
        assert seen(pair[0]) == seen(pair[1]), (step, op)


def test_compilable_writers_of_one_shared_memmap_storage_never_overwrite_each_other(tmp_path):
    # the cursor of a storage shared between processes lives in its shared counters: a
    # compilable writer's own cursor tensor made two writers of one storage write over each
    # other's rows (the second buffer started at row 0 again)
    from tdreplay.storages import LazyMemmapStorage

    def make() -> ReplayBuffer:
        return ReplayBuffer(storage=LazyMemmapStorage(8, scratch_dir=tmp_path, existsok=True),
                            writer=RoundRobinWriter(compilable=True), compilable=True)

    a = make()
    assert a.extend(torch.zeros(3, 1)).tolist() == [0, 1, 2]
    b = make()
    assert b.extend(torch.ones(2, 1)).tolist() == [3, 4]
    assert a.extend(torch.full((1, 1), 2.0)).tolist() == [5]
    assert a.add(torch.full((1,), 3.0)) == 6
    assert b.add(torch.full((1,), 4.0)) == 7
    assert len(a) == len(b) == 8 and a.write_count == b.write_count == 8
    assert b[:].reshape(-1).tolist() == [0.0, 0.0, 0.0, 1.0, 1.0, 2.0, 3.0, 4.0]
