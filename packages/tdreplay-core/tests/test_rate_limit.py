"""Rate limiters (Reverb's MinSize / SampleToInsertRatio) on local buffers."""

from __future__ import annotations

import pickle
import sys
import threading
import time

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import (
    CheckpointError,
    ListStorage,
    MinSize,
    RateLimiter,
    RateLimitTimeout,
    ReplayBuffer,
    SampleToInsertRatio,
    TensorDictReplayBuffer,
)


def test_min_size_non_blocking_raises_at_once_then_allows():
    rb = ReplayBuffer(storage=ListStorage(100), rate_limiter=MinSize(5, timeout=0), batch_size=4)
    rb.extend([1, 2, 3, 4])
    assert not rb.can_sample(4)
    with pytest.raises(RateLimitTimeout, match="non-blocking") as err:
        rb.sample()
    assert isinstance(err.value, TimeoutError) and err.value.operation == "sample"
    assert rb.rate_limiter.samples == 0  # a refused sample is not counted
    rb.add(5)
    assert rb.can_sample(4) and len(rb.sample()) == 4
    assert (rb.rate_limiter.inserts, rb.rate_limiter.samples) == (5, 4)


def test_min_size_blocks_until_another_thread_inserts():
    rb = TensorDictReplayBuffer(storage=ListStorage(100), rate_limiter=MinSize(10, timeout=30),
                                batch_size=3)
    out = {}

    def learner():
        out["batch"] = rb.sample()
        out["when"] = time.monotonic()

    thread = threading.Thread(target=learner)
    thread.start()
    time.sleep(0.2)
    rb.extend(TensorDict({"x": torch.arange(6)}, [6]))
    time.sleep(0.2)
    assert "batch" not in out  # still 6 < 10
    written = time.monotonic()
    rb.extend(TensorDict({"x": torch.arange(4)}, [4]))
    thread.join(30)
    assert out["batch"].batch_size == torch.Size([3]) and out["when"] >= written


def test_blocking_sample_times_out_with_a_clear_error():
    rb = ReplayBuffer(rate_limiter=MinSize(2, timeout=0.2))
    start = time.monotonic()
    with pytest.raises(RateLimitTimeout, match="within 0.2 s"):
        rb.sample(1)
    assert time.monotonic() - start >= 0.2


def test_sample_to_insert_ratio_blocks_the_side_that_runs_ahead():
    limiter = SampleToInsertRatio(samples_per_insert=2.0, min_size_to_sample=4, error_buffer=8.0,
                                  timeout=0)
    assert (limiter.min_diff, limiter.max_diff) == (0.0, 16.0)
    rb = ReplayBuffer(storage=ListStorage(1000), rate_limiter=limiter)
    rb.extend(list(range(4)))  # inserts free up to min size
    rb.extend(list(range(4)))  # diff 16 <= 16
    with pytest.raises(RateLimitTimeout, match="inserting 1 items") as err:
        rb.add(0)  # diff 18 > 16
    assert err.value.operation == "insert" and len(rb) == 8 and limiter.inserts == 8
    rb.sample(10)  # diff 16 - 10 = 6 >= 0
    with pytest.raises(RateLimitTimeout):
        rb.sample(7)  # 6 - 7 < 0: learners wait for collectors
    rb.sample(6)
    rb.extend(list(range(8)))  # diff 16
    assert (limiter.inserts, limiter.samples) == (16, 16)


def test_inserts_wait_for_samples_in_another_thread():
    limiter = SampleToInsertRatio(1.0, 1, (0.0, 4.0), timeout=30)
    rb = ReplayBuffer(storage=ListStorage(1000), rate_limiter=limiter)
    rb.extend([0, 1, 2, 3])
    done = threading.Event()

    def collector():
        rb.extend([4, 5])
        done.set()

    thread = threading.Thread(target=collector)
    thread.start()
    assert not done.wait(0.3)
    rb.sample(2)
    thread.join(30)
    assert done.is_set() and len(rb) == 6


def test_a_batch_that_can_never_be_allowed_is_refused():
    rb = ReplayBuffer(rate_limiter=SampleToInsertRatio(1.0, 1, 3.0, timeout=None))
    rb.extend([1, 2])
    with pytest.raises(ValueError, match="never allowed"):
        rb.sample(10)


@pytest.mark.parametrize("kwargs, match", [
    ({"samples_per_insert": 0, "min_size_to_sample": 1, "error_buffer": 5}, "samples_per_insert"),
    ({"samples_per_insert": 4, "min_size_to_sample": 1, "error_buffer": 2}, "error_buffer"),
    ({"samples_per_insert": 1, "min_size_to_sample": 0, "error_buffer": 5}, "min_size_to_sample"),
])
def test_bad_arguments_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SampleToInsertRatio(**kwargs)


def test_bad_limiter_and_timeout_are_refused():
    with pytest.raises(TypeError, match="rate_limiter must be a RateLimiter"):
        ReplayBuffer(rate_limiter=5)
    with pytest.raises(ValueError, match="timeout"):
        MinSize(3, timeout=-1)


def test_a_failed_write_is_not_counted():
    rb = ReplayBuffer(storage=ListStorage(10), rate_limiter=MinSize(1))
    with pytest.raises(TypeError):
        rb.extend((1, 2))  # a tuple into a ListStorage
    rb.extend([1])
    assert rb.rate_limiter.inserts == 1


def test_counts_travel_in_state_dict_dumps_and_pickles(tmp_path):
    rb = ReplayBuffer(storage=ListStorage(10), rate_limiter=SampleToInsertRatio(1.0, 2, 5.0))
    rb.extend([1, 2, 3])
    rb.sample(2)
    state = rb.state_dict()
    assert state["_rate_limiter"] == {"class": "SampleToInsertRatio", "inserts": 3, "samples": 2}
    other = ReplayBuffer(storage=ListStorage(10), rate_limiter=SampleToInsertRatio(1.0, 2, 5.0))
    other.load_state_dict(state)
    assert (other.rate_limiter.inserts, other.rate_limiter.samples) == (3, 2)

    rb.dumps(tmp_path / "ckpt")
    restored = ReplayBuffer(storage=ListStorage(10), rate_limiter=SampleToInsertRatio(1.0, 2, 5.0))
    restored.loads(tmp_path / "ckpt")
    assert (restored.rate_limiter.inserts, restored.rate_limiter.samples) == (3, 2)
    assert len(restored) == 3

    wrong = ReplayBuffer(storage=ListStorage(10), rate_limiter=MinSize(1))
    with pytest.raises(CheckpointError, match="SampleToInsertRatio"):
        wrong.loads(tmp_path / "ckpt")
    with pytest.raises(ValueError, match="_rate_limiter"):
        wrong.load_state_dict(state)
    assert len(wrong) == 0 and wrong.rate_limiter.inserts == 0  # unchanged

    copy = pickle.loads(pickle.dumps(rb))
    assert (copy.rate_limiter.inserts, copy.rate_limiter.samples) == (3, 2)
    copy.extend([4])  # the copy's limiter has its own lock
    assert copy.rate_limiter.inserts == 4 and rb.rate_limiter.inserts == 3


def test_call_timeout_overrides_the_limiters_timeout_in_this_thread():
    limiter = MinSize(2, timeout=None)
    rb = ReplayBuffer(rate_limiter=limiter)
    with limiter.call_timeout(0.1), pytest.raises(RateLimitTimeout, match="0.1 s"):
        rb.sample(1)
    assert isinstance(limiter, RateLimiter)


def test_prefetching_buffer_waits_for_min_size():
    rb = ReplayBuffer(storage=ListStorage(10), rate_limiter=MinSize(3, timeout=0), prefetch=2,
                      batch_size=2)
    rb.extend([1, 2])
    with pytest.raises(RateLimitTimeout):
        rb.sample()
    rb.add(3)
    assert len(rb.sample()) == 2


def test_empty_resets_the_limiters_counts_as_reverbs_table_reset():
    from tdreplay.core import ListStorage, ReplayBuffer, SampleToInsertRatio

    rb = ReplayBuffer(storage=ListStorage(100), batch_size=2,
                      rate_limiter=SampleToInsertRatio(1.0, 2, 4.0, timeout=0))
    rb.extend(list(range(6)))  # diff 6 = max_diff (2 + 4): inserts wait for samples now
    assert not rb.rate_limiter.can_insert(1, len(rb))
    rb.empty()
    assert (rb.rate_limiter.inserts, rb.rate_limiter.samples, len(rb)) == (0, 0, 0)
    rb.extend(list(range(6)))  # the counts of the items gone no longer hold it back
    assert rb.rate_limiter.inserts == 6 == len(rb)
    rb.sample()
    rb.empty(empty_write_count=False)
    assert (rb.rate_limiter.inserts, rb.rate_limiter.samples, rb.write_count) == (0, 0, 6)


def test_an_empty_extend_is_never_held_back():
    from tdreplay.core import ListStorage, RateLimiter, ReplayBuffer

    limiter = RateLimiter(samples_per_insert=1.0, min_size_to_sample=1, min_diff=-5.0,
                          max_diff=2.0, timeout=0)
    rb = ReplayBuffer(storage=ListStorage(10), rate_limiter=limiter)
    rb.extend([1, 2])
    rb.load_state_dict({**rb.state_dict(), "_rate_limiter": {"class": "RateLimiter",
                                                             "inserts": 9, "samples": 0}})
    assert not limiter.can_insert(1, len(rb))  # diff 9 > max_diff 2
    assert rb.extend([]).tolist() == [] and limiter.inserts == 9  # inserts nothing: allowed


def test_an_insert_that_can_never_be_allowed_raises_at_once():
    # (it waited for good with the default timeout=None: 20 inserts at 1 sample per insert
    # need a difference of 20, max_diff is 8 and samples stop at min_diff 0)
    rb = ReplayBuffer(storage=ListStorage(100),
                      rate_limiter=SampleToInsertRatio(1.0, 4, 4.0), batch_size=2)
    with pytest.raises(ValueError, match="an insert of 20 items is never allowed"):
        rb.extend(list(range(20)))
    assert len(rb) == 0 and rb.rate_limiter.inserts == 0
    rb.extend(list(range(8)))  # as many as max_diff allows from 0: allowed
    assert len(rb) == 8
    free = ReplayBuffer(storage=ListStorage(100), rate_limiter=MinSize(4))
    assert free.extend(list(range(50))).numel() == 50  # MinSize never limits inserts


def test_restored_counts_below_the_usual_lowest_difference_allow_a_larger_insert():
    # (counts saved under other parameters: a difference of -7 lets 5 inserts at 0.5 in, and
    # the never-allowed rule, which assumed the difference never goes below min(0, min_diff),
    # refused them)
    limiter = SampleToInsertRatio(0.5, 1, (0.0, 2.0), timeout=0)
    state = limiter.state_dict()
    state.update(inserts=10, samples=12)
    limiter.load_state_dict(state)
    rb = ReplayBuffer(storage=ListStorage(100), rate_limiter=limiter)
    assert limiter.can_insert(5, 0)
    assert rb.extend(list(range(5))).numel() == 5


@pytest.mark.parametrize("limiter", [MinSize(10), SampleToInsertRatio(1.0, 10, 20.0)])
def test_a_sample_a_full_storage_cannot_allow_raises_at_once(limiter):
    # (min_size_to_sample above the storage's max_size: the sample waited for good)
    rb = ReplayBuffer(storage=ListStorage(4), rate_limiter=limiter, batch_size=2)
    rb.extend([1, 2, 3, 4, 5])
    with pytest.raises(ValueError, match=r"min_size_to_sample=10 is more than the storage "
                                         r"can hold \(max_size=4\)"):
        rb.sample()
    assert limiter.samples == 0


def test_a_sample_inside_locked_that_would_wait_raises_at_once():
    # it waited for writes that wait for the lock it held: forever with timeout=None (here
    # the whole timeout, then RateLimitTimeout)
    rb = ReplayBuffer(storage=ListStorage(100), batch_size=4, rate_limiter=MinSize(8, timeout=3))
    rb.extend(list(range(4)))
    with rb.locked():
        with pytest.raises(RuntimeError, match=r"inside rb.locked\(\).*Nothing was drawn"):
            rb.sample()
        rb.extend(list(range(4, 8)))  # (allowed: MinSize waits for no sample)
        assert len(rb.sample()) == 4  # allowed now: drawn under the lock
    assert rb.rate_limiter.samples == 4


def test_a_write_inside_locked_that_would_wait_raises_at_once():
    rb = ReplayBuffer(storage=ListStorage(100),
                      rate_limiter=SampleToInsertRatio(1.0, 1, (0.0, 4.0), timeout=3))
    rb.extend([0, 1, 2, 3])
    with rb.locked():
        with pytest.raises(RuntimeError, match=r"inside rb.locked\(\).*Nothing was written"):
            rb.extend([4, 5])
        assert len(rb) == 4
        rb.sample(2)
        rb.extend([4, 5])  # allowed now
    assert len(rb) == 6 and rb.rate_limiter.inserts == 6


def test_a_consuming_buffer_with_a_limiter_takes_writes_and_samples_from_two_threads():
    # the limiter asked len(rb) (which takes the buffer's lock with a ConsumingSampler) while
    # holding its condition, and a write counted its items under the buffer's lock: the two
    # threads waited for each other for good within a few hundred calls
    from tdreplay.core.consuming import ConsumingSampler

    rb = ReplayBuffer(storage=ListStorage(10_000), sampler=ConsumingSampler(),
                      rate_limiter=MinSize(1, timeout=30))
    drawn: list[int] = []
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # (threads switch often: the interleavings that deadlocked)
    try:
        def collector() -> None:
            for i in range(0, 3000, 2):
                rb.extend([i, i + 1])

        def learner() -> None:
            while len(drawn) < 1500:
                drawn.extend(rb.sample(1))

        threads = [threading.Thread(target=collector, daemon=True),
                   threading.Thread(target=learner, daemon=True)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    finally:
        sys.setswitchinterval(interval)
    assert not any(thread.is_alive() for thread in threads)
    assert len(drawn) == len(set(drawn)) == 1500  # each item consumed once
    assert len(rb) == 1500


def test_a_sample_let_through_before_an_empty_waits_for_min_size_again():
    # the gate let the sample through with 8 items; an empty() and 4 new items came before
    # its draw, which drew from 4 items (below min_size_to_sample), or from none: "Cannot
    # sample from an empty storage"
    rb = ReplayBuffer(storage=ListStorage(100), batch_size=4, rate_limiter=MinSize(8, timeout=30))
    rb.extend(list(range(8)))
    drawn: list[list[int]] = []
    with rb.locked():
        thread = threading.Thread(target=lambda: drawn.append(rb.sample()))
        thread.start()
        time.sleep(0.3)  # through the gate, waiting for the lock
        rb.empty()
        rb.extend([100, 101, 102, 103])
    time.sleep(0.3)
    assert thread.is_alive() and not drawn  # back at the gate: 4 items, fewer than 8
    rb.extend([200, 201, 202, 203])
    thread.join(30)
    assert len(drawn[0]) == 4 and set(drawn[0]) <= {100, 101, 102, 103, 200, 201, 202, 203}
    # the counts the empty set to 0 hold this sample once, not a correction of the first try
    assert rb.rate_limiter.samples == 4 and rb.rate_limiter.inserts == 8


def test_a_reset_while_a_sample_is_counted_leaves_the_new_counts_alone():
    limiter = MinSize(1, timeout=0)
    with pytest.raises(KeyError), limiter.sampling(3, size=lambda: 5):
        limiter.reset()  # (a buffer's empty() meanwhile)
        raise KeyError("the draw failed")
    assert limiter.samples == 0  # not -3
    with limiter.sampling(3, size=lambda: 5) as drew:
        limiter.reset()
        drew(1)
    assert limiter.samples == 0


def test_a_sample_inside_another_buffers_locked_that_would_wait_raises_at_once():
    # two buffers of one storage share its lock: inside one's locked(), a sample of the other
    # that the limiter refuses waited its whole timeout for writes that need that lock
    storage = ListStorage(100)
    first = ReplayBuffer(storage=storage)
    second = ReplayBuffer(storage=storage, batch_size=4, rate_limiter=MinSize(8, timeout=20))
    first.extend(list(range(4)))
    with first.locked():
        assert second.holds_lock()
        # (a wait would end in RateLimitTimeout after 20 s)
        with pytest.raises(RuntimeError, match=r"inside rb.locked\(\).*Nothing was drawn"):
            second.sample()
    assert not second.holds_lock() and second.rate_limiter.samples == 0


def test_a_storage_emptied_past_the_buffer_resets_the_counts_as_empty_does():
    # the counts of the items gone held every later write back (inserts at max_diff) and
    # every sample (fewer than min_size_to_sample items): stuck for good with timeout=None
    rb = ReplayBuffer(storage=ListStorage(100),
                      rate_limiter=SampleToInsertRatio(1.0, 1, (0.0, 4.0), timeout=0))
    rb.extend([0, 1, 2, 3])
    with pytest.raises(RateLimitTimeout):
        rb.extend([4])
    rb.storage.empty()
    rb.extend([10, 11])  # allowed again: counted from 0
    assert rb.rate_limiter.inserts == 2 and rb.rate_limiter.samples == 0
    assert sorted(rb.sample(2)) in ([10, 10], [10, 11], [11, 11])
    # the buffer's own restore keeps the counts it loads
    state = rb.state_dict()
    other = ReplayBuffer(storage=ListStorage(100),
                         rate_limiter=SampleToInsertRatio(1.0, 1, (0.0, 4.0), timeout=0))
    other.load_state_dict(state)
    other.extend([12])
    assert other.rate_limiter.inserts == 3 and other.rate_limiter.samples == 2
