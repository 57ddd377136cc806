"""A ``sample`` that raises after the draw (a read-side transform, a ``collate_fn``, attaching
the info) changes nothing: the same ``len``, the same sampler state, and the next batches are
those the buffer would have given had the failed one never been asked for (nothing consumed,
no epoch position lost). Each buffer is compared with an untouched twin: same items, same
seed, generators seeded again after the failure (random numbers drawn are not given back)."""

from __future__ import annotations

import random
import threading
from functools import partial

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import (
    ConsumingSampler,
    ListStorage,
    RandomSampler,
    ReplayBuffer,
    SamplerWithoutReplacement,
    TensorDictReplayBuffer,
    testing,
)


class Boom(RuntimeError):
    """What the failing step raises."""


#: identity, except that the call numbered ``at`` (from 0) raises :class:`Boom`
FailOnce = partial(testing.FailOnce, error=Boom)


class FailingInfo(TensorDictReplayBuffer):
    """A buffer whose ``attach_info`` raises on its first call."""

    failed = False

    def attach_info(self, data, info, only_missing=False):
        if not self.failed:
            self.failed = True
            raise Boom("attaching the info failed")
        return super().attach_info(data, info, only_missing)


def _items(n):
    return [torch.tensor(i) for i in range(n)]


def _pair(make_sampler, n=10, batch_size=None, seed=0, **failing):
    """A buffer with a failing step (``failing``: the ``transform=`` or ``collate_fn=`` that
    raises) and its untouched twin, both holding ``n`` items, with generators of ``seed``."""
    buffers = []
    for kwargs in (failing, {}):
        rb = ReplayBuffer(storage=ListStorage(n), sampler=make_sampler(), batch_size=batch_size,
                          generator=torch.Generator().manual_seed(seed), **kwargs)
        rb.extend(_items(n))
        buffers.append(rb)
    return buffers


def _reseed(*buffers, seed=1):
    for rb in buffers:
        rb.sampler.generator.manual_seed(seed)


def _fail(rb, batch_size):
    with pytest.raises(Boom):
        rb.sample(batch_size)


def _same_draws(a, b, batch_size, count):
    for _ in range(count):
        assert a.sample(batch_size).tolist() == b.sample(batch_size).tolist()
        assert len(a) == len(b)


SAMPLERS = {
    "without_replacement": lambda: SamplerWithoutReplacement(),
    "without_replacement_drop_last": lambda: SamplerWithoutReplacement(drop_last=True),
    "consuming": lambda: ConsumingSampler(),
    "consuming_twice": lambda: ConsumingSampler(2),
}
FAILING = {  # steps that raise at their second call
    "transform": lambda: {"transform": FailOnce(at=1)},
    "collate_fn": lambda: {"collate_fn": _stacking(FailOnce(at=1))},
}


def _stacking(step):
    return lambda items: step(torch.stack(items))


@pytest.mark.parametrize("failing", FAILING.values(), ids=FAILING.keys())
@pytest.mark.parametrize("make_sampler", SAMPLERS.values(), ids=SAMPLERS.keys())
def test_failed_sample_changes_nothing(make_sampler, failing, same):
    rb, twin = _pair(make_sampler, n=10, batch_size=3, **failing())
    _same_draws(rb, twin, 3, 1)  # mid-epoch, some items counted
    _fail(rb, 3)
    assert len(rb) == len(twin)
    same(rb.sampler.state_dict(), twin.sampler.state_dict(), "sampler state")
    assert rb.sampler.ran_out == twin.sampler.ran_out
    _reseed(rb, twin)
    _same_draws(rb, twin, 3, 2)
    same(rb.sampler.state_dict(), twin.sampler.state_dict(), "sampler state")


@pytest.mark.parametrize("make_sampler", SAMPLERS.values(), ids=SAMPLERS.keys())
def test_failed_first_sample_changes_nothing(make_sampler, same):
    rb, twin = _pair(make_sampler, n=7, batch_size=4, transform=FailOnce())
    _fail(rb, 4)
    assert len(rb) == len(twin) == 7
    same(rb.sampler.state_dict(), twin.sampler.state_dict(), "sampler state")
    _reseed(rb, twin)
    _same_draws(rb, twin, 4, 2)


def test_failed_batch_ending_the_epoch_is_drawn_again():
    # the batch that ends an epoch also draws the next one: both are undone
    rb, twin = _pair(lambda: SamplerWithoutReplacement(shuffle=False), n=6,
                     transform=FailOnce(at=1))
    assert rb.sample(4).tolist() == [0, 1, 2, 3]
    _fail(rb, 4)
    assert not rb.sampler.ran_out
    assert rb.sample(4).tolist() == [4, 5] and rb.sampler.ran_out
    twin.sample(4)
    assert twin.sample(4).tolist() == [4, 5]


def test_consuming_buffer_loses_no_item_to_a_failed_sample():
    # consume_after_n_samples= (buffer_consume): every item is still handed out exactly once
    rb = ReplayBuffer(storage=ListStorage(8), consume_after_n_samples=1,
                      transform=FailOnce(at=1), generator=torch.Generator().manual_seed(0))
    rb.extend(_items(8))
    seen = rb.sample(3).tolist()
    _fail(rb, 3)
    assert len(rb) == 5 and rb.sampler.reusable_slots(rb.storage, 8).numel() == 3
    while len(rb):
        seen += rb.sample(3).tolist()
    assert sorted(seen) == list(range(8))


def test_iteration_resumes_where_the_failed_batch_was():
    rb = ReplayBuffer(storage=ListStorage(10), sampler=SamplerWithoutReplacement(),
                      batch_size=3, transform=FailOnce(at=2))
    rb.extend(_items(10))
    seen = []
    with pytest.raises(Boom):
        for batch in rb:
            seen += batch.tolist()
    for batch in rb:  # the rest of the epoch
        seen += batch.tolist()
    assert sorted(seen) == list(range(10))


@pytest.mark.parametrize("make_sampler", [SAMPLERS["without_replacement"],
                                          SAMPLERS["consuming"]], ids=["swor", "consuming"])
def test_failed_info_attachment_changes_nothing(make_sampler, same):
    buffers = []
    for cls in (FailingInfo, TensorDictReplayBuffer):
        rb = cls(storage=ListStorage(8), sampler=make_sampler(),
                 generator=torch.Generator().manual_seed(0))
        rb.extend(TensorDict({"obs": torch.arange(8)}, [8]))
        buffers.append(rb)
    rb, twin = buffers
    with pytest.raises(Boom):
        rb.sample(3)
    same(rb.sampler.state_dict(), twin.sampler.state_dict(), "sampler state")
    _reseed(rb, twin)
    for _ in range(2):
        same(rb.sample(3)["obs"], twin.sample(3)["obs"], "sample")


def test_a_failed_read_changes_nothing(same):
    # a sample unit or storage read failing under the lock is undone as well
    rb, twin = _pair(SamplerWithoutReplacement, n=6)
    _same_draws(rb, twin, 2, 1)
    before = rb.sampler.state_dict()

    def refuse(index):
        raise Boom("cannot read")

    rb.storage.get = rb.storage.get_trusted = refuse  # (this instance only)
    _fail(rb, 2)
    same(rb.sampler.state_dict(), before, "sampler state")


def test_stateless_samplers_are_never_marked():
    # the hot path of RandomSampler takes no mark: a sampler whose marks fail still samples
    class Unmarked(RandomSampler):
        def draw_mark(self):
            raise AssertionError("a stateless sampler was marked")

    rb = ReplayBuffer(storage=ListStorage(4), sampler=Unmarked(), transform=FailOnce())
    rb.extend(_items(4))
    _fail(rb, 2)
    assert rb.sample(2).shape == (2,)


def test_marks_nest_and_the_inner_is_undone_first(same):
    storage = ListStorage(6)
    storage.set(torch.arange(6), list("abcdef"))
    sampler = ConsumingSampler()
    sampler.sample(storage, 1)
    outer_state = sampler.state_dict()
    outer = sampler.draw_mark()
    sampler.sample(storage, 2)
    inner_state = sampler.state_dict()
    inner = sampler.draw_mark()
    sampler.sample(storage, 2)
    sampler.undo_draws(inner)
    same(sampler.state_dict(), inner_state, "after the inner undo")
    sampler.undo_draws(outer)
    same(sampler.state_dict(), outer_state, "after the outer undo")


def test_consuming_journal_is_dropped_with_the_last_mark():
    storage = ListStorage(4)
    storage.set(torch.arange(4), list("abcd"))
    sampler = ConsumingSampler(3)
    mark = sampler.draw_mark()
    sampler.sample(storage, 2)
    del mark
    for _ in range(3):
        sampler.sample(storage, 1)  # no mark open: nothing kept to undo
    fresh = sampler.draw_mark()
    assert fresh.start == 0


class FailsAtRandom:
    """A transform that refuses about a third of the batches (seeded), on any thread."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.lock = threading.Lock()

    def __call__(self, data):
        with self.lock:
            fail = self.rng.random() < 0.35
        if fail:
            raise Boom("refused")
        return data


@pytest.mark.parametrize("sampler", ["without_replacement", "consuming"])
def test_threads_sampling_with_failing_batches_lose_and_repeat_no_item(sampler):
    """Four threads sample one buffer whose transform refuses a third of the batches; exactly
    one epoch's worth of batches succeeds (a thread takes a ticket before it samples and gives
    it back when the batch fails). Each failed draw is undone under the lock it was drawn
    under, so the batches handed out cover every item exactly once: none lost to a failed
    batch, none handed out twice."""
    n, batch = 196, 7
    rb = ReplayBuffer(storage=ListStorage(n), transform=FailsAtRandom(seed=3),
                      sampler=SAMPLERS[sampler]())
    rb.extend(_items(n))
    tickets = threading.Semaphore(n // batch)
    delivered: list[int] = []
    out_lock = threading.Lock()
    failures = [0]

    def worker() -> None:
        while tickets.acquire(blocking=False):
            try:
                items = rb.sample(batch)
            except Boom:
                tickets.release()  # this batch did not count
                with out_lock:
                    failures[0] += 1
                continue
            with out_lock:
                delivered.extend(int(x) for x in items)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert failures[0] > 5  # (the transform did refuse batches)
    assert sorted(delivered) == list(range(n))
