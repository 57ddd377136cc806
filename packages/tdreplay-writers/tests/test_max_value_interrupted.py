"""An exception raised asynchronously in the middle of a ``TensorDictMaxValueWriter`` write (an
interrupt: ``KeyboardInterrupt`` from Ctrl-C, or what a signal handler raises, lands wherever
the interpreter is) leaves the buffer as the same write uninterrupted leaves it: the rows kept
written whole, ranked, counted, and the sampler told of them. Each test raises
``KeyboardInterrupt`` once at one step of the write and compares the buffer with a twin that
wrote the same batches without it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.core.testing import InterruptOnce, TellingSampler, assert_same, buffer_snapshot
from tdreplay.storages import LazyTensorStorage
from tdreplay.writers import TensorDictMaxValueWriter


def _torn_write(storage_set: Callable[..., Any]) -> Callable[..., Any]:
    """A storage write of other values (-7) at the same rows: a write cut short half-way."""
    return lambda where, data: storage_set(where, data.apply(lambda x: torch.full_like(x, -7)))


def _buffer() -> TensorDictReplayBuffer:
    return TensorDictReplayBuffer(storage=LazyTensorStorage(6), sampler=TellingSampler(),
                                  writer=TensorDictMaxValueWriter(rank_key="r"))


def _batch(ranks: list[float]) -> TensorDict:
    r = torch.tensor(ranks)
    return TensorDict({"r": r, "obs": torch.stack([r, -r], 1)}, [len(ranks)])


STEPS = [("storage", "set", "before"), ("storage", "set", "after"),
         ("storage", "set", "torn"), ("sampler", "extend", "before"),
         ("sampler", "extend", "after")]
# offered rows: filling a storage with room; over a full one, some rows kept (replacing the
# lowest) and some not; every row kept in batch order
CASES = {"filling": ([1.0, 2.0], [5.0, 3.0, 4.0]),
         "replacing": ([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [0.5, 9.0, 2.5, 8.0]),
         "whole": ([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [10.0, 11.0])}


@pytest.mark.parametrize("owner,name,when", STEPS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_interrupted_extend_completes(monkeypatch: pytest.MonkeyPatch, owner: str, name: str,
                                      when: str, case: str) -> None:
    first, offered = CASES[case]
    rb, twin = _buffer(), _buffer()
    for buffer in (rb, twin):
        buffer.extend(_batch(first))
    fn = getattr(getattr(rb, owner), name)
    step = InterruptOnce(fn, after=when == "after",
                         instead=_torn_write(fn) if when == "torn" else None)
    monkeypatch.setattr(getattr(rb, owner), name, step)
    with pytest.raises(KeyboardInterrupt):
        rb.extend(_batch(offered))
    assert step.fired
    twin.extend(_batch(offered))
    assert_same(buffer_snapshot(rb), buffer_snapshot(twin))
    assert_same(rb[:], twin[:])
    assert rb.sampler.told == set(range(len(rb)))  # every row counted can be sampled
    assert rb.writer.ranks.tolist() == rb[:]["r"].double().tolist()  # rows as ranked
    for buffer in (rb, twin):  # and it goes on where the twin goes on
        buffer.extend(_batch([7.0, 0.0]))
    assert_same(buffer_snapshot(rb), buffer_snapshot(twin))


@pytest.mark.parametrize("when", ["before", "after", "torn"])
def test_interrupted_add_completes(monkeypatch: pytest.MonkeyPatch, when: str) -> None:
    rb, twin = _buffer(), _buffer()
    for buffer in (rb, twin):
        buffer.extend(_batch([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]))
    monkeypatch.setattr(rb.storage, "set", InterruptOnce(
        rb.storage.set, after=when == "after",
        instead=_torn_write(rb.storage.set) if when == "torn" else None))
    item = TensorDict({"r": torch.tensor(9.0), "obs": torch.tensor([9.0, -9.0])}, [])
    with pytest.raises(KeyboardInterrupt):
        rb.add(item)
    twin.add(item)
    assert_same(buffer_snapshot(rb), buffer_snapshot(twin))
    assert_same(rb[:], twin[:])
    assert rb.sampler.told == set(range(6))


def test_refused_write_after_an_interrupt_check_leaves_heap() -> None:
    """A write the storage refuses (a missing entry) is not completed: the heap, the rows and
    the counts stay as they were."""
    rb = _buffer()
    rb.extend(_batch([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]))
    before = buffer_snapshot(rb)
    with pytest.raises(KeyError):
        rb.extend(TensorDict({"r": torch.tensor([9.0])}, [1]))
    assert_same(buffer_snapshot(rb), before)
    assert rb.writer.interrupted_rows is None
