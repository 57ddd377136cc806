"""Writes through transforms with state (a held-back item, as ``MultiStepTransform``'s steps)
into a buffer with a rate limiter whose gate makes them wait: the transforms run once the
write may go on, under the buffer's lock, so that a checkpoint or an ``empty()`` made while
a write waits sees the transforms' state and the storage of one moment."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import torch

from tdreplay.core import (
    ListStorage,
    MinSize,
    RateLimitTimeout,
    ReplayBuffer,
    SampleToInsertRatio,
    Transform,
)


class HoldLast(Transform):
    """Holds the last value of each batch back and writes it before the next batch."""

    has_state = True

    def __init__(self) -> None:
        super().__init__()
        self.held: list[int] = []
        self.calls = 0

    def inv(self, batch: list[int]) -> list[int]:
        self.calls += 1
        joined = self.held + list(batch)
        self.held = joined[-1:]
        return joined[:-1]

    def drop_held_items(self) -> None:
        self.held = []

    def state_dict(self) -> dict[str, Any]:
        return {"held": list(self.held)}

    def check_state_dict(self, state: Any) -> None:
        if not isinstance(state.get("held"), list):
            raise ValueError("held must be a list")

    def load_state_dict(self, state: Any) -> None:
        self.held = list(state["held"])


def _buffer(limiter: Any, size: int = 100) -> tuple[ReplayBuffer, HoldLast]:
    hold = HoldLast()
    rb = ReplayBuffer(storage=ListStorage(size), rate_limiter=limiter)
    rb.append_transform(hold)  # (its inverse runs on writes)
    return rb, hold


def _waiting_write(rb: ReplayBuffer, batch: list[int]) -> tuple[threading.Thread, list[Any]]:
    """A thread extending ``rb`` with ``batch``; returns it once its write waits at the gate."""
    outcome: list[Any] = []

    def collector() -> None:
        try:
            outcome.append(rb.extend(batch))
        except Exception as err:  # noqa: BLE001 (handed to the test)
            outcome.append(err)

    thread = threading.Thread(target=collector)
    thread.start()
    time.sleep(0.3)
    assert thread.is_alive() and not outcome  # waiting for samples
    return thread, outcome


def _ratio() -> SampleToInsertRatio:
    # at most 4 inserts ahead of the samples
    return SampleToInsertRatio(1.0, 1, (0.0, 4.0), timeout=30)


def test_a_checkpoint_taken_while_a_write_waits_holds_the_state_before_it():
    rb, hold = _buffer(_ratio())
    rb.extend(list(range(5)))  # rows 0-3 written, 4 held back
    thread, outcome = _waiting_write(rb, list(range(5, 8)))
    saved = rb.state_dict()  # the write waits: neither its rows nor its steps
    assert saved["_transform"]["0:HoldLast"]["held"] == [4]
    rb.sample(3)
    thread.join(30)
    assert torch.equal(outcome[0], torch.tensor([4, 5, 6]))  # the slots of values 4, 5, 6
    assert rb[:] == list(range(7)) and hold.held == [7]

    restored, restored_hold = _buffer(_ratio())
    restored.load_state_dict(saved)
    assert restored[:] == list(range(4))
    restored.sample(3)
    restored.extend(list(range(5, 8)))  # the same write again: nothing lost, nothing twice
    assert restored[:] == list(range(7))
    assert restored_hold.held == [7]


def test_a_dump_taken_while_a_write_waits_restores_the_state_before_it(tmp_path):
    rb, _ = _buffer(_ratio())
    rb.extend(list(range(5)))
    thread, _ = _waiting_write(rb, list(range(5, 8)))
    rb.dumps(tmp_path / "ckpt")
    rb.sample(3)
    thread.join(30)

    restored, restored_hold = _buffer(_ratio())
    restored.loads(tmp_path / "ckpt")
    assert restored[:] == list(range(4))
    assert restored_hold.held == [4]


def test_an_empty_while_a_write_waits_leaves_only_that_writes_items():
    rb, hold = _buffer(MinSize(1, timeout=30))
    # MinSize never holds writes back: a ratio that does, relieved by the empty
    rb.set_rate_limiter(_ratio())
    rb.extend(list(range(5)))  # 4 held back
    thread, outcome = _waiting_write(rb, list(range(5, 8)))
    rb.empty()  # drops the held step 4 and resets the counts: the write may go on
    thread.join(30)
    assert not isinstance(outcome[0], Exception), outcome
    # the write's own steps, 5 and 6 (7 held back), without the step held before the empty
    assert rb[:] == [5, 6]
    assert hold.held == [7]


def test_concurrent_writes_through_transforms_with_state_run_one_at_a_time():
    rb, hold = _buffer(SampleToInsertRatio(1.0, 1, (0.0, 1000.0), timeout=30), size=300)
    barrier = threading.Barrier(4)

    def collector(start: int) -> None:
        barrier.wait()
        for i in range(20):
            rb.extend(list(range(start + 3 * i, start + 3 * i + 3)))

    threads = [threading.Thread(target=collector, args=(1000 * k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    # every value written once or held back: none lost, none twice (two writes swapping the
    # held step would do both)
    expected = sorted(1000 * k + j for k in range(4) for j in range(60))
    assert sorted(rb[:] + hold.held) == expected
    assert hold.calls == 80 and len(rb) == rb.write_count == rb.rate_limiter.inserts == 239


def test_a_write_that_times_out_at_the_gate_leaves_the_transforms_as_they_were():
    rb, hold = _buffer(SampleToInsertRatio(1.0, 1, (0.0, 4.0), timeout=0.3))
    rb.extend(list(range(5)))
    before = hold.calls
    with pytest.raises(RateLimitTimeout):
        rb.extend(list(range(5, 8)))
    assert hold.held == [4] and rb[:] == list(range(4))
    assert rb.rate_limiter.inserts == 4
    rb.sample(3)
    rb.extend(list(range(5, 8)))
    assert rb[:] == list(range(7)) and hold.calls > before


def test_a_write_inside_locked_that_would_wait_raises_and_keeps_the_held_step():
    rb, hold = _buffer(_ratio())
    rb.extend(list(range(5)))
    with rb.locked():
        with pytest.raises(RuntimeError, match=r"inside rb.locked\(\).*Nothing was written"):
            rb.extend(list(range(5, 8)))
    assert hold.held == [4] and len(rb) == 4
