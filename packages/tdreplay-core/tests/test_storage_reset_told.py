"""A storage emptied or restored past its buffers (``rb.storage.empty()``,
``rb.storage.loads(path)``, ``rb.storage.load_state_dict``, as TorchRL programs do) runs under
their lock and tells each of them at once: no sample reads a row half-replaced, and the
sampler, writer, rate limiter and batches drawn ahead follow before the next call."""

from __future__ import annotations

import threading

import pytest

from tdreplay.core import ListStorage, RandomSampler, ReplayBuffer, SamplerWithoutReplacement
from tdreplay.core.rate_limit import SampleToInsertRatio


def _epochs() -> ReplayBuffer:
    return ReplayBuffer(storage=ListStorage(10), batch_size=3, sampler=SamplerWithoutReplacement())


def _restore_past(rb: ReplayBuffer, how: str, tmp_path) -> None:
    """Fill ``rb`` with 9 rows, then restore its storage, past it, to 3 rows."""
    source = ListStorage(10)
    source.set(range(3), [0, 1, 2])
    source.dumps(tmp_path / "storage")
    rb.extend(list(range(10, 19)))
    if how == "loads":
        rb.storage.loads(tmp_path / "storage")
    else:
        rb.storage.load_state_dict(source.state_dict())


@pytest.mark.parametrize("how", ["loads", "load_state_dict"])
def test_the_sampler_knows_the_restored_rows_before_the_next_sample(how, tmp_path):
    rb = _epochs()
    rb.extend(list(range(20, 29)))
    rb.sample()  # (an epoch begun over 9 rows)
    _restore_past(rb, how, tmp_path)
    assert sorted(rb.sampler.state_dict()["perm"].tolist()) in ([], [0, 1, 2])
    assert sorted(rb.sample()) == [0, 1, 2]  # an epoch of the restored rows
    rb.extend([50, 51])
    assert rb[:] == [0, 1, 2, 50, 51]


def _limited() -> ReplayBuffer:
    """A rate-limited buffer that counted 4 inserts and 2 samples."""
    return _limited_on(ListStorage(10))


def _limited_on(storage: ListStorage) -> ReplayBuffer:
    rb = ReplayBuffer(storage=storage, batch_size=2)
    rb.set_rate_limiter(SampleToInsertRatio(samples_per_insert=1.0, min_size_to_sample=2,
                                            error_buffer=4.0))
    rb.extend(list(range(4)))
    rb.sample()
    assert (rb.rate_limiter.inserts, rb.rate_limiter.samples) == (4, 2)
    return rb


def test_a_rate_limiter_counts_from_zero_right_after_an_empty_past_the_buffer():
    rb = _limited()
    rb.storage.empty()
    assert (rb.rate_limiter.inserts, rb.rate_limiter.samples) == (0, 0)
    assert not rb.can_sample()


def test_a_refused_restore_tells_no_one_and_counts_nothing():
    # the buffers were told of a load_state_dict that raised before changing anything: their
    # samplers relearnt the rows (priorities lost), their rate limiters counted from 0
    rb = _limited()
    restores = rb.storage.restore_count
    bad = {**rb.storage.state_dict(), "max_size": "nope"}
    with pytest.raises(ValueError, match="max_size"):
        rb.storage.load_state_dict(bad)
    assert (rb.rate_limiter.inserts, rb.rate_limiter.samples) == (4, 2)
    assert rb.storage.restore_count == restores
    assert rb[:] == [0, 1, 2, 3]


def test_a_buffer_whose_part_raises_at_the_reset_keeps_no_other_from_hearing_of_it():
    # the first buffer's sampler raised while it learnt the emptied storage: the buffers
    # attached after it were not told (their rate limiters kept the counts of rows gone)
    class Failing(RandomSampler):
        def learn_written_slots(self, storage):
            raise RuntimeError("learn_written_slots failed")

    storage = ListStorage(10)
    first = ReplayBuffer(storage=storage, sampler=Failing())
    second = _limited_on(storage)
    with pytest.raises(RuntimeError, match="learn_written_slots failed"):
        storage.empty()
    assert len(storage) == 0 and len(first) == 0
    assert (second.rate_limiter.inserts, second.rate_limiter.samples) == (0, 0)


def test_prefetched_batches_of_rows_gone_are_dropped_at_the_reset():
    rb = ReplayBuffer(storage=ListStorage(10), batch_size=2, prefetch=2)
    rb.extend(list(range(6)))
    rb.sample()
    rb.storage.empty()
    assert rb.stats()["prefetch_queue_size"] == 0
    rb.extend([100, 101, 102])
    for _ in range(5):
        assert set(rb.sample()) <= {100, 101, 102}


def test_every_buffer_of_the_storage_is_told_once_per_restore(tmp_path):
    learnt: list[int] = []

    class Counting(RandomSampler):
        def learn_written_slots(self, storage):
            learnt.append(len(storage))
            super().learn_written_slots(storage)

    storage = ListStorage(8)
    a = ReplayBuffer(storage=storage, sampler=Counting())
    b = ReplayBuffer(storage=storage, sampler=Counting())
    a.extend([1, 2, 3])
    storage.dumps(tmp_path / "ckpt")  # (its checkpointer's load calls load_state_dict)
    b.extend([4])
    storage.loads(tmp_path / "ckpt")
    assert learnt == [3, 3]  # a and b, once each, the 3 restored rows
    learnt.clear()
    a.load_state_dict(a.state_dict())  # through a: a loads its own sampler state, b is told
    assert learnt == [3]


def test_a_storage_read_by_no_buffer_or_by_another_object_still_resets():
    storage = ListStorage(4)
    storage.set(range(2), ["a", "b"])
    storage.empty()
    assert len(storage) == 0
    storage.attach(object.__new__(type("Reader", (), {})))  # (TorchRL lets any object attach)
    storage.set(range(2), ["a", "b"])
    storage.empty()
    assert len(storage) == 0


class _PausingSampler(RandomSampler):
    """Stops inside its draw (the buffer's lock held) until told to go on."""

    def __init__(self) -> None:
        super().__init__()
        self.inside = threading.Event()
        self.go_on = threading.Event()
        self.pause = False

    def sample(self, storage, batch_size):
        drawn = super().sample(storage, batch_size)
        if self.pause:
            self.inside.set()
            assert self.go_on.wait(30)
        return drawn


def test_an_empty_from_another_thread_waits_for_the_sample_it_meets():
    # the storage's empty() took no buffer lock: it ran between a sample's draw and its read,
    # which raised IndexError for slots the storage no longer held
    sampler = _PausingSampler()
    rb = ReplayBuffer(storage=ListStorage(10), sampler=sampler, batch_size=4)
    rb.extend(list(range(8)))
    sampler.pause = True
    got: list[object] = []
    sampling = threading.Thread(target=lambda: got.append(rb.sample()))
    sampling.start()
    assert sampler.inside.wait(30)
    emptying = threading.Thread(target=rb.storage.empty)
    emptying.start()
    emptying.join(timeout=0.3)
    assert emptying.is_alive()  # waits for the sample's lock
    sampler.go_on.set()
    sampling.join(30)
    emptying.join(30)
    assert not sampling.is_alive() and not emptying.is_alive()
    assert len(got) == 1 and len(got[0]) == 4 and set(got[0]) <= set(range(8))
    assert len(rb) == 0


@pytest.mark.parametrize("how", ["storage", "other buffer", "loads"])
def test_a_used_writer_goes_on_after_the_newest_restored_row(how, tmp_path):
    # a full ring [5, 6, 3, 4] whose newest row is 1 restored past a writer at cursor 3: it
    # wrote row 3 (the restored 4, not the oldest 3) and cut the ring after 100 (6 -> 3);
    # TorchRL's writer keeps its cursor the same way
    storage = ListStorage(4)
    rb, other = ReplayBuffer(storage=storage), ReplayBuffer(storage=storage)
    rb.extend([0, 1, 2])
    source = ListStorage(4)
    source.set(range(4), [1, 2, 3, 4])
    source.set(range(2), [5, 6])
    assert source.last_written_row == 1
    if how == "storage":
        storage.load_state_dict(source.state_dict())
    elif how == "other buffer":
        saved = ReplayBuffer(storage=source)
        saved.writer.load_state_dict({"cursor": 2, "write_count": 6})
        other.load_state_dict(saved.state_dict())
    else:
        source.dumps(tmp_path / "ring")
        storage.loads(tmp_path / "ring")
    assert rb.writer.cursor == 2 and rb.writer.write_count == 3
    assert rb.extend([100]).tolist() == [2]
    assert rb[:] == [5, 6, 100, 4] and storage.last_written_row == 2
    # emptied past it: back to row 0
    storage.empty()
    assert rb.writer.cursor == 0 and rb.extend([7]).tolist() == [0]
