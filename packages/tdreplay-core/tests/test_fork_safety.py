"""Buffers across ``os.fork`` (tdreplay.core.fork_safety): a forked child gets each buffer
between two operations, its locks free, its worker threads' unfinished work dropped."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest
import torch

from tdreplay.core import (
    ListStorage,
    RandomSampler,
    ReplayBuffer,
    SamplerWithoutReplacement,
    fork_safety,
)
from tdreplay.core.fork_safety import (
    ForkGuard,
    LeftLockedByFork,
    guard_forks,
    left_locked,
    refusing_lock,
)
from tdreplay.core.rate_limit import MinSize, RateLimitTimeout
from tdreplay.core.testing import in_forked_child

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")

class GatedSampler(RandomSampler):
    """Draws only once ``go`` is set (``inside`` tells that a draw is waiting, under the
    buffer's lock)."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()
        self.go.set()
        self.inside = threading.Event()

    def sample(self, storage: Any, batch_size: int) -> Any:
        if not self.go.is_set():
            self.inside.set()
            self.go.wait()
        return super().sample(storage, batch_size)


def test_fork_while_the_prefetch_worker_draws_gives_a_working_child() -> None:
    sampler = GatedSampler()
    rb = ReplayBuffer(storage=ListStorage(10), sampler=sampler, batch_size=2, prefetch=1)
    rb.extend(list(range(10)))
    rb.sample()
    rb.state_dict()  # (the batch drawn ahead is drawn)
    sampler.go.clear()
    rb.sample()  # hands the queued batch out; the worker's next draw waits inside the lock
    assert sampler.inside.wait(10)
    threading.Timer(0.2, sampler.go.set).start()  # the fork waits for that draw to end

    def child() -> list[int]:
        batches = [[int(x) for x in rb.sample()] for _ in range(3)]
        return [x for batch in batches for x in batch]

    drawn = in_forked_child(child)
    assert len(drawn) == 6 and all(0 <= x < 10 for x in drawn)
    assert len(rb.sample()) == 2  # the parent goes on as well


def test_fork_during_extends_of_another_thread_gives_a_state_between_two_extends() -> None:
    rb = ReplayBuffer(storage=ListStorage(100_000))
    stop = threading.Event()

    def extend_forever() -> None:
        start = 0
        while not stop.is_set() and start + 500 <= 100_000:
            rb.extend(list(range(start, start + 500)))
            start += 500

    writer = threading.Thread(target=extend_forever)
    writer.start()
    try:
        for _ in range(5):
            time.sleep(0.005)

            def child() -> tuple[int, int, bool]:
                items = rb.storage.items()[: len(rb)]
                return len(rb), rb.write_count, items == list(range(len(rb)))

            size, written, in_order = in_forked_child(child)
            assert size == written and size % 500 == 0 and in_order
    finally:
        stop.set()
        writer.join()


def test_a_lock_kept_past_the_wait_refuses_every_call_in_the_child(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fork_safety, "FORK_WAIT_S", 0.1)
    rb = ReplayBuffer(storage=ListStorage(10), batch_size=2)
    rb.extend(list(range(10)))
    holding, let_go = threading.Event(), threading.Event()

    def hold_the_lock() -> None:
        with rb.locked():
            holding.set()
            let_go.wait()

    holder = threading.Thread(target=hold_the_lock)
    holder.start()
    assert holding.wait(10)
    try:
        def child() -> tuple[str, str]:
            try:
                rb.sample()
            except LeftLockedByFork as exc:
                return type(exc).__mro__[1].__name__, str(exc)
            return "", "sampled"

        base, message = in_forked_child(child)
    finally:
        let_go.set()
        holder.join()
    assert base == "RuntimeError"
    assert "in use by another thread when this process forked" in message
    assert len(rb.sample()) == 2  # the parent's buffer is untouched


def test_the_prefetch_queue_of_the_child_continues_the_epoch() -> None:
    rb = ReplayBuffer(storage=ListStorage(10), batch_size=2, prefetch=2,
                      sampler=SamplerWithoutReplacement())
    rb.extend(list(range(10)))
    first = [int(x) for x in rb.sample()]
    rb.state_dict()  # (the two batches drawn ahead are drawn)

    def rest_of_epoch() -> list[int]:
        return [x for _ in range(4) for x in [int(x) for x in rb.sample()]]

    in_child = in_forked_child(rest_of_epoch)
    assert sorted(first + in_child) == list(range(10))
    assert sorted(first + rest_of_epoch()) == list(range(10))  # the parent's epoch too


def test_updates_pending_at_the_fork_stay_with_the_parent() -> None:
    rb = ReplayBuffer(storage=ListStorage(10))
    release = threading.Event()
    blocked = rb.submit_update(lambda: release.wait(30))

    def child() -> tuple[int, int]:
        rb.synchronize()  # does not wait for the parent's update
        return rb.submit_update(lambda: 7).result(timeout=10), len(rb)

    try:
        assert in_forked_child(child) == (7, 0)
    finally:
        release.set()
    assert blocked.result(timeout=10) is True
    rb.synchronize()


def test_a_rate_limited_sample_waiting_at_the_fork_is_the_parents() -> None:
    rb = ReplayBuffer(storage=ListStorage(10), batch_size=2,
                      rate_limiter=MinSize(4, timeout=30.0))
    rb.extend([0, 1])
    sampled: list[Any] = []
    waiter = threading.Thread(target=lambda: sampled.append(rb.sample()))
    waiter.start()
    time.sleep(0.05)  # (the sample waits for two more items)

    def child() -> tuple[str, int, int]:
        rb.rate_limiter.timeout = 0.1
        try:
            rb.sample()
        except RateLimitTimeout:
            return "timed out", rb.rate_limiter.inserts, rb.rate_limiter.samples
        return "sampled", -1, -1

    try:
        assert in_forked_child(child) == ("timed out", 2, 0)
    finally:
        rb.extend([2, 3])
        waiter.join(10)
    assert len(sampled) == 1 and len(sampled[0]) == 2


def test_a_guard_that_stays_busy_is_waited_for_then_left(
        monkeypatch: pytest.MonkeyPatch) -> None:
    class Busy(ForkGuard):
        def __init__(self) -> None:
            self.busy = True
            self.tries = 0
            self.child_saw: bool | None = None
            guard_forks(self)

        def hold(self, timeout: float | None = None) -> bool:
            self.tries += 1
            return not self.busy

        def release(self) -> None:
            pass

        def reset_in_child(self, held: bool) -> None:
            self.child_saw = held

    monkeypatch.setattr(fork_safety, "FORK_WAIT_S", 0.05)
    busy = Busy()
    try:
        assert in_forked_child(lambda: busy.child_saw) is False
    finally:
        busy.busy = False  # (no later fork waits for it, whatever happened)
    assert busy.tries > 2  # tried, waited for, tried again until the time ran out
    assert in_forked_child(lambda: busy.child_saw) is True


def test_left_locked_and_refusing_lock() -> None:
    lock = threading.RLock()
    assert not left_locked(lock)
    taken = threading.Event()
    done = threading.Event()

    def take() -> None:
        with lock:
            taken.set()
            done.wait()

    thread = threading.Thread(target=take)
    thread.start()
    assert taken.wait(10)
    assert left_locked(lock)  # held by another thread
    done.set()
    thread.join()
    stand_in = refusing_lock("The widget")
    with pytest.raises(LeftLockedByFork, match="The widget was in use"):
        stand_in.acquire()
    with pytest.raises(RuntimeError, match="The widget"):
        with stand_in:
            pass


def test_tensors_survive_the_fork_unchanged() -> None:
    rb = ReplayBuffer(storage=ListStorage(4), batch_size=2, prefetch=1)
    rb.extend([torch.tensor([float(i)]) for i in range(4)])
    rb.sample()
    assert in_forked_child(lambda: sorted(float(x) for x in rb.storage.items())) == [
        0.0, 1.0, 2.0, 3.0]
