"""Differential tests of ``prefetch``: a buffer that keeps ``k`` batches drawn ahead
(``ReplayBuffer(..., prefetch=k)``, ``k`` in 0..3) against a model built on a twin buffer
without prefetch, fed the same seeded history (extends, samples, priority updates,
``empty()``, restores by ``state_dict``, ``dumps``, pickle and ``deepcopy``).

The model: the first ``sample`` draws ``k + 1`` batches from the twin and hands out the first;
each later ``sample`` draws one more and hands out the oldest; ``empty()`` drops the batches
drawn ahead (the random numbers they used are not given back). The prefetching buffer is
settled (its queued batches finished) after every sample, so the draws ahead happen before
the next step of the history, as in the model. A restored copy must hand out the saved queue
first and then draw as the saved buffer would have: the same batches, the same
``info["index"]``, the same priority weights.

Samplers: random and without replacement (core, never prefetched: epochs end), prioritized
(with ``update_priority`` between samples) and slice samplers (tdreplay-samplers, over
tdreplay-storages' tensor storages: tdreplay-core's ``test`` extra).

The first tests are focused reproductions of divergences found (xfail until fixed), if any;
the last ones guard the behaviours that agree.
"""

from __future__ import annotations

import random
import time
from concurrent.futures import wait

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import (
    ListStorage,
    RandomSampler,
    ReplayBuffer,
    SamplerWithoutReplacement,
    TensorDictReplayBuffer,
)
from tdreplay.core.testing import RESTORES, FailOnce, restored
from tdreplay.samplers import PrioritizedSampler, SliceSampler
from tdreplay.storages import LazyTensorStorage

CAP = 40
BATCH = 6


def _settle(rb):
    """Wait until every batch queued ahead is drawn (the draws happen before the next step)."""
    wait(list(rb._prefetcher._queue), timeout=60)


def _idle(rb):
    """Wait until the worker thread has finished every job it took (one worker: a job
    submitted now runs after them)."""
    if rb._prefetcher._executor is not None:
        rb._prefetcher._executor.submit(lambda: None).result(timeout=60)


def _sampler(kind):
    if kind == "random":
        return RandomSampler()
    if kind == "without":
        return SamplerWithoutReplacement()
    if kind == "prioritized":
        return PrioritizedSampler(CAP, alpha=0.7, beta=0.5)
    return SliceSampler(num_slices=2, traj_key="episode", strict_length=False)


def _make(kind, k, seed, transform=None):
    def make():
        if kind in ("random", "without"):
            return ReplayBuffer(storage=ListStorage(CAP), sampler=_sampler(kind), batch_size=BATCH,
                                prefetch=k, transform=transform,
                                generator=torch.Generator().manual_seed(seed))
        return TensorDictReplayBuffer(storage=LazyTensorStorage(CAP), sampler=_sampler(kind),
                                      batch_size=BATCH, prefetch=k, transform=transform,
                                      generator=torch.Generator().manual_seed(seed))
    return make


def _data(kind, rng, start, n):
    if kind in ("random", "without"):
        return [torch.tensor(float(i)) for i in range(start, start + n)]
    episode = torch.tensor(sorted(rng.randrange(3) for _ in range(n))) + start
    return TensorDict({"obs": torch.arange(start, start + n, dtype=torch.float32),
                       "episode": episode}, [n])


def _plain(batch, info):
    """A comparable form of a sample: values, index, priority weights."""
    if isinstance(batch, TensorDict):
        values = batch["obs"].tolist()
    else:
        values = batch.tolist()
    index = info["index"]
    index = [t.tolist() for t in index] if isinstance(index, tuple) else index.tolist()
    weight = info.get("priority_weight")
    return values, index, None if weight is None else [round(w, 5) for w in weight.tolist()]


class Model:
    """A prefetching buffer as the module docstring describes, on a twin without prefetch."""

    def __init__(self, twin, k):
        self.twin, self.k, self.pending = twin, k, []

    def sample(self):
        if self.k == 0 or self.twin.sampler.finite_epochs:
            return _plain(*self.twin.sample(return_info=True))
        while len(self.pending) < self.k + 1:
            self.pending.append(_plain(*self.twin.sample(return_info=True)))
        return self.pending.pop(0)

    def empty(self):
        self.pending.clear()
        self.twin.empty()


def _history(kind, k, seed, steps=40):
    rng = random.Random(seed)
    make = _make(kind, k, seed)
    rb = make()
    model = Model(_make(kind, 0, seed)(), k)
    keep, written = [], 0
    for step in range(steps):
        op = rng.random()
        if len(rb) < BATCH or op < 0.15:
            data = _data(kind, rng, 100 * written, rng.randint(3, 12))
            written += 1
            assert rb.extend(data).tolist() == model.twin.extend(data).tolist()
        elif op < 0.65:
            got = _plain(*rb.sample(return_info=True))
            _settle(rb)
            assert got == model.sample(), (kind, k, seed, step)
            if kind == "prioritized" and rng.random() < 0.6:
                index = torch.tensor(got[1])
                prio = torch.rand(len(index), generator=torch.Generator().manual_seed(step)) + 0.1
                rb.update_priority(index, prio)
                model.twin.update_priority(index, prio)
        elif op < 0.72:
            rb.empty()
            model.empty()
        else:
            rb = restored(rb, make, rng.choice(RESTORES), keep)
        assert len(rb) == len(model.twin) and rb.write_count == model.twin.write_count


class SlowSampler(RandomSampler):
    """A random sampler whose draws take a while (so a job is in flight when one fails)."""

    def sample(self, storage, batch_size):
        time.sleep(0.15)
        return super().sample(storage, batch_size)


def test_failed_prefetched_sample_leaves_no_job_drawing():
    rb = ReplayBuffer(storage=ListStorage(CAP), sampler=SlowSampler(), batch_size=4,
                      prefetch=2, transform=FailOnce(at=0),
                      generator=torch.Generator().manual_seed(0))
    rb.extend([torch.tensor(float(i)) for i in range(30)])
    with pytest.raises(RuntimeError, match="FailOnce"):
        rb.sample()
    state = rb._rng.get_state().clone()  # sample() has returned: nothing may draw now
    _idle(rb)
    assert torch.equal(rb._rng.get_state(), state)


@pytest.mark.parametrize("k", [0, 1, 2, 3])
@pytest.mark.parametrize("kind", ["random", "without"])
def test_prefetch_histories_core_samplers(kind, k):
    for seed in range(3):
        _history(kind, k, seed)


@pytest.mark.parametrize("k", [0, 1, 3])
@pytest.mark.parametrize("kind", ["prioritized", "slice"])
def test_prefetch_histories_other_samplers(kind, k):
    for seed in range(2):
        _history(kind, k, seed)


@pytest.mark.parametrize("k", [0, 1, 2, 3])
def test_sample_sequence_is_the_same_for_every_depth(k):
    rbs = [_make("random", d, 7)() for d in (0, k)]
    for rb in rbs:
        rb.extend([torch.tensor(float(i)) for i in range(30)])
    assert ([rbs[0].sample().tolist() for _ in range(8)]
            == [rbs[1].sample().tolist() for _ in range(8)])


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("at", [0, 1, 3])
def test_failed_prefetched_sample_raises_in_turn_then_draws_afresh(k, at):
    """The batches drawn before the failing one are handed out, then the failure raises, then
    sampling goes on (the generator reseeded: random numbers drawn are not given back)."""
    rb = _make("random", k, 3, transform=FailOnce(at=at))()
    twin = _make("random", 0, 3, transform=FailOnce(at=at))()
    for b in (rb, twin):
        b.extend([torch.tensor(float(i)) for i in range(30)])
    for _ in range(at):
        assert rb.sample().tolist() == twin.sample().tolist()
    with pytest.raises(RuntimeError, match="FailOnce"):
        rb.sample()
    with pytest.raises(RuntimeError, match="FailOnce"):
        twin.sample()
    _idle(rb)  # the jobs queued behind the failed one (see the xfail above) have finished
    for b in (rb, twin):
        b._rng.manual_seed(11)
    assert [rb.sample().tolist() for _ in range(5)] == [twin.sample().tolist() for _ in range(5)]
    assert len(rb) == 30 and rb._prefetcher.queued == k


@pytest.mark.parametrize("how", RESTORES)
def test_restored_queue_is_handed_out_first(how):
    make = _make("random", 2, 5)
    rb, twin = make(), _make("random", 0, 5)()
    for b in (rb, twin):
        b.extend([torch.tensor(float(i)) for i in range(30)])
    first = rb.sample().tolist()
    copy = restored(rb, make, how, [])
    expected = [twin.sample().tolist() for _ in range(6)]
    assert [first] + [copy.sample().tolist() for _ in range(5)] == expected
