"""An exception raised asynchronously in the middle of ``add`` / ``extend`` (an interrupt:
``KeyboardInterrupt`` from Ctrl-C, or whatever a signal handler raises, lands wherever the
interpreter is) leaves the buffer consistent: the write is complete when the exception
propagates (rows, the storage's count, the writer's cursor and count, the sampler told of
every row with its priority), as the same write uninterrupted leaves it. Each test raises
``KeyboardInterrupt`` once at one step of the write (before or after it runs) and compares
the buffer with a twin that wrote the same batches without the interrupt."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import (
    ListStorage,
    ReplayBuffer,
    TensorDictReplayBuffer,
    Transform,
)
from tdreplay.core.testing import InterruptOnce, TellingSampler, assert_same, buffer_snapshot


def _interrupt(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, after: bool
               ) -> InterruptOnce:
    step = InterruptOnce(getattr(owner, name), after)
    monkeypatch.setattr(owner, name, step)
    return step


def _list_buffer() -> ReplayBuffer:
    return ReplayBuffer(storage=ListStorage(8), sampler=TellingSampler())


def _assert_consistent(rb: ReplayBuffer) -> None:
    """Every row counted is one the sampler was told of."""
    assert rb.sampler.told == set(range(len(rb)))


# (owner of the step: the buffer's storage, sampler or writer; the step; before / after it)
LIST_STEPS = [
    ("sampler", "extend", False),  # between the write and the sampler (the reported bug)
    ("sampler", "extend", True),
    ("storage", "set", False),
    ("storage", "set", True),  # rows written, the cursor and the count not moved
    ("writer", "_bump_generations", True),
    ("writer", "_advance", True),  # the writer's count moved, the sampler not told
    ("storage", "rows_to_slots", False),
]


@pytest.mark.parametrize("owner,name,after", LIST_STEPS)
@pytest.mark.parametrize("first", [3, 8], ids=["filling", "full"])
def test_interrupted_extend_completes(monkeypatch: pytest.MonkeyPatch, owner: str, name: str,
                                      after: bool, first: int) -> None:
    rb, twin = _list_buffer(), _list_buffer()
    for buffer in (rb, twin):
        buffer.extend(list(range(first)))
    step = _interrupt(monkeypatch, getattr(rb, owner), name, after)
    with pytest.raises(KeyboardInterrupt):
        rb.extend(list(range(100, 105)))
    assert step.fired
    twin.extend(list(range(100, 105)))
    assert_same(buffer_snapshot(rb), buffer_snapshot(twin))
    assert rb[:] == twin[:]
    _assert_consistent(rb)
    rb.extend([7, 7])  # and it goes on where the twin goes on
    twin.extend([7, 7])
    assert_same(buffer_snapshot(rb), buffer_snapshot(twin))


@pytest.mark.parametrize("owner,name,after", [
    ("sampler", "add", False), ("storage", "set", False), ("storage", "set", True),
    ("writer", "_advance", True)])
def test_interrupted_add_completes(monkeypatch: pytest.MonkeyPatch, owner: str, name: str,
                                   after: bool) -> None:
    rb, twin = _list_buffer(), _list_buffer()
    for buffer in (rb, twin):
        buffer.extend(list(range(3)))
    _interrupt(monkeypatch, getattr(rb, owner), name, after)
    with pytest.raises(KeyboardInterrupt):
        rb.add(100)
    twin.add(100)
    assert_same(buffer_snapshot(rb), buffer_snapshot(twin))
    assert rb[:] == twin[:]
    _assert_consistent(rb)


def test_refused_write_still_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A write the storage refuses (an ``Exception`` raised before anything is written) is
    not written by the completion either."""
    rb = ReplayBuffer(storage=ListStorage(8), sampler=TellingSampler())
    rb.extend(list(range(8)))
    before = buffer_snapshot(rb)

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise TypeError("refused")
    monkeypatch.setattr(rb.storage, "set", refuse)
    with pytest.raises(TypeError, match="refused"):
        rb.extend([1, 2])
    with pytest.raises(TypeError, match="refused"):
        rb.add(1)
    assert_same(buffer_snapshot(rb), before)


def test_interrupted_consuming_extend_completes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The consuming buffer's writes (into consumed slots first, then at the cursor)."""
    def make() -> ReplayBuffer:
        rb = ReplayBuffer(storage=ListStorage(6), consume_after_n_samples=1)
        rb.extend(list(range(6)))
        torch.manual_seed(0)
        rb.sample(2)
        return rb
    rb, twin = make(), make()
    _interrupt(monkeypatch, rb.storage, "set", after=True)
    with pytest.raises(KeyboardInterrupt):
        rb.extend([10, 11, 12])
    twin.extend([10, 11, 12])
    assert_same(buffer_snapshot(rb), buffer_snapshot(twin))
    assert rb.storage[:] == twin.storage[:]


def test_interrupted_write_keeps_the_transform_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """A write completed before its interrupt propagated keeps the state its write-side
    transforms took on (it is undone only for a write that did not happen)."""
    class Count(Transform):
        has_state = True

        def __init__(self) -> None:
            super().__init__()
            self.n = 0

        def inv(self, data: Any) -> Any:
            self.n += 1
            return data

        def state_dict(self) -> dict[str, Any]:
            return {"n": self.n}

        def load_state_dict(self, state: dict[str, Any]) -> None:
            self.n = state["n"]
    rb, count = _list_buffer(), Count()
    rb.append_transform(count)
    _interrupt(monkeypatch, rb.sampler, "extend", after=False)
    with pytest.raises(KeyboardInterrupt):
        rb.extend([1, 2, 3])
    assert (count.n, len(rb), rb.write_count) == (1, 3, 3)
    _assert_consistent(rb)


def _two_leaves(values: torch.Tensor) -> TensorDict:
    return TensorDict({"a": values.clone(), "b": -values.float()}, [values.numel()])


@pytest.mark.parametrize("kind", ["lazy", "memmap"])
def test_interrupt_between_leaf_copies_tears_no_row(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Any, kind: str) -> None:
    """An interrupt after the first leaf of the rows was copied (overwriting the old rows of a
    full storage): the rows are written whole, counted and told, none half old."""
    storages = pytest.importorskip("tdreplay.storages")

    def make(where: str) -> TensorDictReplayBuffer:
        storage = storages.LazyTensorStorage(8) if kind == "lazy" else \
            storages.LazyMemmapStorage(8, scratch_dir=tmp_path / where)
        rb = TensorDictReplayBuffer(storage=storage, sampler=TellingSampler())
        rb.extend(_two_leaves(torch.arange(8)))
        return rb
    rb, twin = make("rb"), make("twin")
    layout = rb.storage._layout
    copy_rows = layout.copy_rows

    def first_leaf_then_interrupt(start: int, stop: int, src: Any, shapes: Any = None) -> bool:
        monkeypatch.setattr(layout, "copy_rows", copy_rows)
        layout.leaves[0][start:stop] = src[0]
        raise KeyboardInterrupt
    monkeypatch.setattr(layout, "copy_rows", first_leaf_then_interrupt)
    batch = _two_leaves(torch.arange(100, 105))
    with pytest.raises(KeyboardInterrupt):
        rb.extend(batch)
    twin.extend(batch)
    assert (rb[:]["b"] == -rb[:]["a"].float()).all()  # no row torn
    assert rb.write_count == twin.write_count == 13
    assert rb.writer.cursor == twin.writer.cursor
    _assert_consistent(rb)
    assert len(rb) == len(twin)  # (memmap: the old rows after the batch's were dropped)
    assert (rb[:] == twin[:]).all()


@pytest.mark.parametrize("owner,name,after", [
    ("sampler", "extend", False), ("sampler", "extend_with_priority", False),
    ("storage", "set", True), ("writer", "_advance", True)])
def test_interrupted_prioritized_extend_completes(monkeypatch: pytest.MonkeyPatch, owner: str,
                                                  name: str, after: bool) -> None:
    """The reported case: a prioritized buffer's rows are all counted and all sampleable, with
    the priorities the batch brought (``extend_with_priority``) or the max priority."""
    pytest.importorskip("tdreplay.storages")
    samplers = pytest.importorskip("tdreplay.samplers")
    from tdreplay.storages import LazyTensorStorage

    with_priority = name == "extend_with_priority"

    def make() -> Any:
        if with_priority:
            return samplers.TensorDictPrioritizedReplayBuffer(
                alpha=0.7, beta=0.9, storage=LazyTensorStorage(8))
        return samplers.PrioritizedReplayBuffer(alpha=0.7, beta=0.9,
                                                storage=LazyTensorStorage(8))

    def batch(first: int, n: int) -> Any:
        values = torch.arange(first, first + n)
        if not with_priority:
            return values
        return TensorDict({"obs": values, "td_error": values.float() + 1}, [n])
    rb, twin = make(), make()
    for buffer in (rb, twin):
        buffer.extend(batch(0, 6))
    step = _interrupt(monkeypatch, getattr(rb, owner), name, after)
    with pytest.raises(KeyboardInterrupt):
        rb.extend(batch(100, 5))
    assert step.fired
    twin.extend(batch(100, 5))
    assert_same(buffer_snapshot(rb), buffer_snapshot(twin))
    assert len(rb) == 8 and rb.write_count == 11
    torch.manual_seed(0)
    drawn = rb.sample(2000)
    stored = rb[:]
    if with_priority:
        drawn, stored = drawn["obs"], stored["obs"]
    assert set(drawn.tolist()) == set(stored.tolist())  # every row counted is drawn
