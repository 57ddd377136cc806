"""``prefetch``: exactly N batches in flight, same draws as without it, nothing stale after resets."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from tdreplay.core import ListStorage, RandomSampler, ReplayBuffer


def scalars(start: int, stop: int) -> list[torch.Tensor]:
    return [torch.tensor(float(i)) for i in range(start, stop)]


def make(prefetch: int | None, seed: int = 0, sampler=None) -> ReplayBuffer:
    return ReplayBuffer(storage=ListStorage(100), sampler=sampler, batch_size=4, prefetch=prefetch,
                        generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("n", [1, 3])
def test_exactly_n_batches_in_flight_after_each_sample(n):
    rb = make(prefetch=n)
    rb.extend(scalars(0, 20))
    assert rb._prefetcher.queued == 0
    for _ in range(5):
        assert rb.sample().shape == torch.Size([4])
        assert rb._prefetcher.queued == n


def test_prefetched_draws_equal_direct_draws():
    a, b = make(prefetch=2), make(prefetch=None)
    a.extend(scalars(0, 50))
    b.extend(scalars(0, 50))
    assert [a.sample().tolist() for _ in range(6)] == [b.sample().tolist() for _ in range(6)]


def test_other_batch_size_is_sampled_directly():
    rb = make(prefetch=2)
    rb.extend(scalars(0, 20))
    rb.sample()
    assert rb.sample(7).shape == torch.Size([7])
    assert rb._prefetcher.queued == 2


def test_failed_prefetch_is_not_replayed_after_the_buffer_fills():
    rb = make(prefetch=2)
    with pytest.raises(RuntimeError, match="empty"):
        rb.sample()
    assert rb._prefetcher.queued == 0
    rb.extend(scalars(0, 10))
    assert rb.sample().shape == torch.Size([4])
    assert rb._prefetcher.queued == 2


def test_empty_drops_prefetched_batches():
    rb = make(prefetch=3)
    rb.extend(scalars(0, 10))
    rb.sample()
    rb.empty()
    assert rb._prefetcher.queued == 0
    rb.extend(scalars(100, 110))
    for _ in range(4):
        assert all(v >= 100 for v in rb.sample().tolist())  # nothing from before empty()


@pytest.mark.parametrize("reset", ["empty", "load_state_dict"])
def test_a_storage_reset_past_the_buffer_drops_prefetched_batches(reset):
    # rb.storage.empty() / rb.storage.load_state_dict(...): the three batches queued before
    # were handed out, of rows the storage no longer held
    rb = make(prefetch=3)
    rb.extend(scalars(0, 10))
    rb.sample()
    assert rb._prefetcher.queued == 3
    if reset == "empty":
        rb.storage.empty()
        rb.storage.set(range(10), scalars(100, 110))
    else:
        rb.storage.load_state_dict({"storage": scalars(100, 110), "max_size": 100})
    for _ in range(4):
        assert all(v >= 100 for v in rb.sample().tolist())  # nothing from before the reset


class SlowSampler(RandomSampler):
    def sample(self, storage, batch_size):
        time.sleep(0.02)
        return super().sample(storage, batch_size)


def test_restored_buffer_with_prefetch_samples_like_a_fresh_restore(tmp_path):
    rb = make(prefetch=2, sampler=SlowSampler())
    rb.extend(scalars(0, 50))
    rb.dumps(tmp_path)
    rb.sample()  # one prefetch job runs (holding the lock), the next waits behind it
    rb.loads(tmp_path)  # drops them; they must not draw from the restored generator
    fresh = make(prefetch=None, seed=5, sampler=SlowSampler())
    fresh.loads(tmp_path)
    assert [rb.sample().tolist() for _ in range(4)] == [fresh.sample().tolist() for _ in range(4)]


def test_reset_while_a_prefetch_waits_for_the_lock_does_not_deadlock():
    rb = make(prefetch=2, sampler=SlowSampler())
    rb.extend(scalars(0, 10))
    rb.sample()  # a prefetch job is running (holding the lock) and another is queued
    done = threading.Event()

    def reset() -> None:
        rb.empty()
        done.set()

    worker = threading.Thread(target=reset, daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert done.is_set(), "empty() deadlocked against the prefetch thread"
    assert len(rb) == 0 and rb._prefetcher.queued == 0


def test_prefetch_validation():
    with pytest.raises(TypeError, match="prefetch"):
        ReplayBuffer(prefetch="2")
    with pytest.raises(TypeError, match="prefetch"):
        ReplayBuffer(prefetch=1.5)
    with pytest.raises(ValueError, match="prefetch"):
        ReplayBuffer(prefetch=-1)
    assert ReplayBuffer(prefetch=0)._prefetch == 0


def test_without_default_batch_size_each_sample_has_the_size_asked_for():
    rb = ReplayBuffer(storage=ListStorage(100), prefetch=2)
    rb.extend(scalars(0, 50))
    assert [rb.sample(n).shape[0] for n in (4, 8, 8, 3, 4)] == [4, 8, 8, 3, 4]
    assert rb._prefetcher.queued == 2


def _within(seconds, fn):
    """``fn()`` run in a thread; its result, or a failure if it has not returned in time (a
    deadlock)."""
    out = []
    thread = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"did not return within {seconds} s"
    return out[0]


def test_sample_inside_locked_draws_the_batch_itself():
    # the worker drawing ahead needs the lock this thread holds: sample draws the batch
    # itself (it waited for the worker forever), and the batches queued are handed out after
    rb = make(prefetch=2)
    rb.extend(scalars(0, 20))
    rb.sample()  # two batches now drawn (or being drawn) ahead

    def inside():
        with rb.locked():
            return [rb.sample().tolist() for _ in range(3)]

    batches = _within(10, inside)
    assert len(batches) == 3 and all(len(b) == 4 for b in batches)
    assert rb.sample().shape == torch.Size([4]) and rb._prefetcher.queued == 2


def test_state_dict_inside_locked_does_not_wait_for_the_worker_and_restores_the_stream():
    rb = make(prefetch=2)
    rb.extend(scalars(0, 20))
    rb.sample()

    def inside():
        with rb.locked():
            return rb.state_dict()

    state = _within(10, inside)
    copy = make(prefetch=2, seed=99)
    copy.load_state_dict(state)
    # the copy samples as the original goes on: the batches drawn ahead that were done, then
    # fresh draws from the saved generator where the worker had not drawn yet
    assert [copy.sample().tolist() for _ in range(4)] == [rb.sample().tolist() for _ in range(4)]


def test_sample_inside_locked_with_updates_submitted_says_why_at_once():
    # the submitted update needs the lock this thread holds: the sample says so at once
    rb = make(prefetch=None)
    rb.extend(scalars(0, 4))

    def inside():
        with rb.locked():
            rb.submit_update(lambda: rb.extend(scalars(9, 10)))
            start = time.monotonic()
            with pytest.raises(RuntimeError, match="inside rb.locked"):
                rb.sample()
            return time.monotonic() - start

    assert _within(30, inside) < 5  # (it stalled 60 s, then raised)
    rb.synchronize()
    assert len(rb) == 5 and rb.sample().shape == torch.Size([4])
