"""Differential tests of the rate limiters (:mod:`tdreplay.core.rate_limit`): seeded random
histories run on a real buffer and on a small pure-Python model of Reverb's rule.

The model counts ``inserts`` and ``samples`` and keeps the buffer's content as a ring of
capacity ``C`` (round-robin writes, the last write to a slot wins). With
``diff = inserts * s - samples``, sampling ``n`` needs ``size >= m`` and
``diff - n >= min_diff`` (a batch larger than ``max_diff - min_diff`` is a ``ValueError``),
inserting ``k`` is free while ``size + k <= m`` and else needs
``(inserts + k) * s - samples <= max_diff`` (``k > m`` items with ``k * s`` past
``max_diff - min(0, min_diff)``, which no sample can make room for, are a ``ValueError``). ``empty()`` empties the ring and resets the
write count and the limiter's counts (as Reverb's ``Table.reset`` resets its limiter).

Every call runs with ``timeout=0`` (nothing waits). After each step the buffer must agree
with the model: whether the call was allowed or raised ``RateLimitTimeout``, the length,
write count, limiter counts and stored items, ``can_sample`` and ``can_insert``; a refused or
failed call must leave the whole buffer state (:func:`~tdreplay.core.testing.buffer_snapshot`)
and the limiter's counts as they were. Restores (``state_dict``, ``dumps``, pickle,
``deepcopy``) at random points must carry the counts. Buffers: ``ReplayBuffer`` and
``TensorDictReplayBuffer`` over ``ListStorage`` and ``LazyTensorStorage``, with
``MinSize``, ``SampleToInsertRatio`` and a general ``RateLimiter``, random or prioritized
sampling. A threaded test runs a writer and a sampler against each other with blocking
timeouts.

The first tests are focused reproductions of the divergences found (each failed before its fix).
"""

from __future__ import annotations

import math
import random
import threading
import time
import warnings

import numpy as np
import pytest
import torch
from tensordict import TensorDict, is_tensor_collection

from tdreplay.core import (
    ListStorage,
    MinSize,
    RateLimiter,
    RateLimitTimeout,
    ReplayBuffer,
    SamplerWithoutReplacement,
    SampleToInsertRatio,
    TensorDictReplayBuffer,
)
from tdreplay.core.testing import RESTORES, FailOnce, assert_same, buffer_snapshot, restored
from tdreplay.samplers import PrioritizedSampler
from tdreplay.storages import LazyTensorStorage


# ---- focused reproductions of divergences found ----------------------------------------------
def test_state_dict_during_a_write_in_flight_is_consistent():
    rb = ReplayBuffer(storage=ListStorage(8), rate_limiter=MinSize(1, timeout=5))
    rb.extend([1, 2, 3])
    with rb.locked():  # a write that passed the limiter's gate waits for the buffer's lock
        writer = threading.Thread(target=rb.extend, args=([4, 5],))
        writer.start()
        time.sleep(0.2)
        state = rb.state_dict()  # e.g. a checkpoint thread
    writer.join(10)
    assert not writer.is_alive()
    # the limiter's inserts are "counted when their write succeeds": 3, as the writer's count
    assert state["_rate_limiter"]["inserts"] == state["_writer"]["write_count"] == 3
    assert rb.rate_limiter.inserts == rb.write_count == 5


def test_a_write_in_flight_holds_its_inserts_for_other_writes_but_not_for_samples():
    limiter = SampleToInsertRatio(1.0, 1, (-10.0, 4.0), timeout=0)
    with limiter.inserting(3, size=lambda: 0):
        assert limiter.inserts == 0  # not written yet: samples cannot count on it
        assert not limiter.can_insert(2, size=3)  # 3 held + 2 > max_diff 4
        assert limiter.can_insert(1, size=3)
    assert limiter.inserts == 3 and limiter.can_insert(1, size=3)
    with pytest.raises(RuntimeError), limiter.inserting(1, size=lambda: 3):
        raise RuntimeError("the write failed")
    assert limiter.inserts == 3 and limiter.can_insert(1, size=3)  # given back


def test_the_last_batch_of_an_epoch_counts_the_items_drawn():
    for iterate in (False, True):
        rb = ReplayBuffer(storage=ListStorage(10), sampler=SamplerWithoutReplacement(),
                          rate_limiter=MinSize(1, timeout=0), batch_size=2)
        rb.extend([1, 2, 3])
        batches = list(rb) if iterate else [rb.sample(), rb.sample()]
        assert sorted(len(b) for b in batches) == [1, 2]
        assert rb.rate_limiter.samples == 3


def test_iterating_a_finite_sampler_keeps_the_rate_limit():
    rb = ReplayBuffer(storage=ListStorage(10), sampler=SamplerWithoutReplacement(),
                      rate_limiter=MinSize(5, timeout=0), batch_size=2)
    rb.extend([1, 2, 3])
    with pytest.raises(RateLimitTimeout):
        rb.sample()  # 3 < min_size_to_sample
    with pytest.raises(RateLimitTimeout):
        next(iter(rb))  # yields [3, 1]: not waited for, and not counted
    assert rb.rate_limiter.samples == 0


def test_an_ndim_2_storage_counts_inserts_in_items():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(12, ndim=2),
                                rate_limiter=SampleToInsertRatio(1.0, 1, 8.0, timeout=0))
    rb.extend(TensorDict({"x": torch.arange(6).reshape(2, 3)}, [2, 3]))
    assert len(rb) == 6
    rb.sample(4)  # counts 4 items
    assert (rb.rate_limiter.inserts, rb.rate_limiter.samples) == (6, 4)
    with warnings.catch_warnings():  # (one row of the storage: not told to use extend)
        warnings.simplefilter("error")
        rb.add(TensorDict({"x": torch.arange(2)}, [2]))  # one row of the 2 lanes: 2 items
    assert len(rb) == rb.rate_limiter.inserts == 8


# ---- the model -----------------------------------------------------------------------------------
class Model:
    """Reverb's rule over a ring of ``cap`` slots."""

    def __init__(self, cap, s, m, min_diff, max_diff):
        self.cap, self.s, self.m = cap, s, m
        self.min_diff, self.max_diff = min_diff, max_diff
        self.inserts = self.samples = 0
        self.slots: list[int] = []
        self.cursor = self.write_count = 0

    @property
    def size(self):
        return len(self.slots)

    def never(self, n):
        # a batch wider than the span, or a storage that cannot hold min_size_to_sample items
        return n > self.max_diff - self.min_diff or self.m > self.cap

    def never_insert(self, k):
        # past the free inserts, even from the lowest difference (min_diff, or a fresh 0)
        return k > self.m and k * self.s > self.max_diff - min(0.0, self.min_diff)

    def can_sample(self, n):
        return self.size >= self.m and self.inserts * self.s - self.samples - n >= self.min_diff

    def can_insert(self, k):
        return self.size + k <= self.m or (self.inserts + k) * self.s - self.samples <= self.max_diff

    def write(self, values):
        for v in values:
            if self.cursor < len(self.slots):
                self.slots[self.cursor] = v
            else:
                self.slots.append(v)
            self.cursor = (self.cursor + 1) % self.cap
        self.write_count += len(values)
        self.inserts += len(values)

    def empty(self):
        self.slots, self.cursor, self.write_count = [], 0, 0
        self.inserts = self.samples = 0


# ---- the buffers ---------------------------------------------------------------------------------
# (buffer class, storage, sampler)
CONFIGS = [
    ("rb", "list", "random"),
    ("rb", "lazy", "random"),
    ("tdrb", "lazy", "random"),
    ("tdrb", "list", "random"),
    ("rb", "lazy", "prioritized"),
    ("tdrb", "lazy", "prioritized"),
    ("rb", "list", "prioritized"),
]
LIMITERS = ("min_size", "ratio", "ratio_pair", "general")


def _limiter_args(kind, rng):
    """(limiter factory, (s, m, min_diff, max_diff)) of a random limiter of ``kind``."""
    m = rng.randint(1, 5)
    if kind == "min_size":
        return (lambda: MinSize(m, timeout=0)), (1.0, m, -math.inf, math.inf)
    s = rng.choice([0.5, 1.0, 1.5, 2.0, 3.0])
    if kind == "ratio":
        e = float(rng.randint(math.ceil(2 * max(1.0, s)), 10))
        return ((lambda: SampleToInsertRatio(s, m, e, timeout=0)),
                (s, m, s * m - e, s * m + e))
    if kind == "ratio_pair":
        lo = float(rng.randint(-6, 4))
        hi = lo + rng.randint(math.ceil(2 * max(1.0, s)), 12)
        return (lambda: SampleToInsertRatio(s, m, (lo, hi), timeout=0)), (s, m, lo, hi)
    lo = float(rng.randint(-8, 4))
    hi = lo + rng.randint(0, 14)  # may be narrow: calls that block each other for good
    return ((lambda: RateLimiter(samples_per_insert=s, min_size_to_sample=m, min_diff=lo,
                                 max_diff=hi, timeout=0)), (s, m, lo, hi))


class Subject:
    """A buffer of one config and how to write to and read from it."""

    def __init__(self, config, cap, limiter):
        self.buffer, self.storage, self.sampler = config
        self.cap, self.limiter = cap, limiter

    def make(self):
        storage = (ListStorage(self.cap) if self.storage == "list"
                   else LazyTensorStorage(self.cap))
        kwargs = {"storage": storage, "rate_limiter": self.limiter(),
                  "collate_fn": FailOnce(at=10**9)}  # a sample that fails on demand
        if self.sampler == "prioritized":
            kwargs["sampler"] = PrioritizedSampler(self.cap, 0.7, 0.5)
        cls = TensorDictReplayBuffer if self.buffer == "tdrb" else ReplayBuffer
        return cls(**kwargs)

    def batch(self, values):
        if self.buffer == "tdrb":
            return TensorDict({"x": torch.tensor(values, dtype=torch.long)}, [len(values)])
        if self.storage == "list":
            return list(values)
        return torch.tensor(values, dtype=torch.long)

    def item(self, value):
        if self.buffer == "tdrb":
            return TensorDict({"x": torch.tensor(value)}, [])
        return value if self.storage == "list" else torch.tensor(value)

    def bad_batch(self, k):
        """A batch the storage refuses inside the write (``None``: none such)."""
        if self.storage == "list":
            return None
        if self.buffer == "tdrb":
            return TensorDict({"y": torch.zeros(k, dtype=torch.long)}, [k])
        return torch.zeros(k, 3, dtype=torch.long)

    @staticmethod
    def values(data):
        if isinstance(data, TensorDict) or hasattr(data, "batch_size"):
            data = data.get("x")
        if isinstance(data, torch.Tensor):
            return [int(v) for v in data.reshape(-1)]
        return [v for item in data for v in Subject.values(item)] if isinstance(data, list) \
            else [int(data)]

    def content(self, rb):
        return self.values(rb[:]) if len(rb) else []


def _state(rb):
    limiter = rb.rate_limiter
    return {"buffer": buffer_snapshot(rb), "inserts": limiter.inserts, "samples": limiter.samples}


def _agree(rb, model, subject, rng, where):
    limiter = rb.rate_limiter
    got = (len(rb), rb.write_count, limiter.inserts, limiter.samples, subject.content(rb))
    want = (model.size, model.write_count, model.inserts, model.samples, model.slots)
    assert got == want, f"{where}: (len, write_count, inserts, samples, items) {got} != {want}"
    n, k = rng.randint(1, 8), rng.randint(0, 6)
    assert rb.can_sample(n) == model.can_sample(n), f"{where}: can_sample({n})"
    assert limiter.can_insert(k, len(rb)) == model.can_insert(k), f"{where}: can_insert({k})"


def _equal(a, b):
    """A quick ``assert_same`` without its messages (which format every tensor it sees)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if is_tensor_collection(a):
        return is_tensor_collection(b) and a.batch_size == b.batch_size and \
            set(a.keys(True, True)) == set(b.keys(True, True)) and \
            all(_equal(a.get(k), b.get(k)) for k in a.keys(True, True))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_equal, a, b))
    return bool(a == b)


def _refused(rb, call, error=RateLimitTimeout):
    """Run ``call(rb)``, which must raise ``error`` and change nothing."""
    before = _state(rb)
    with pytest.raises(error) as info:
        call(rb)
    after = _state(rb)
    if not _equal(after, before):
        assert_same(after, before, "refused call left")  # names the entry
        raise AssertionError("refused call changed the buffer")  # pragma: no cover
    return info.value


def run_history(seed, config, limiter_kind, steps=200):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    cap = rng.randint(2, 8)
    make_limiter, (s, m, lo, hi) = _limiter_args(limiter_kind, rng)
    subject = Subject(config, cap, make_limiter)
    model = Model(cap, s, m, lo, hi)
    rb = subject.make()
    keep: list = []
    counter = dumps = 0
    log = []
    for step in range(steps):
        op = rng.choices(["add", "extend", "sample", "query", "empty", "restore", "bad_write",
                          "bad_sample"], [20, 25, 28, 6, 3, 8, 5, 5])[0]
        where = f"seed {seed} step {step} {op}; history {log[-6:]}"
        if op == "add":
            counter += 1
            log.append(("add", counter))
            if model.never_insert(1):
                _refused(rb, lambda b, c=counter: b.add(subject.item(c)), ValueError)
            elif model.can_insert(1):
                rb.add(subject.item(counter))
                model.write([counter])
            else:
                err = _refused(rb, lambda b, c=counter: b.add(subject.item(c)))
                assert err.operation == "insert", where
        elif op == "extend":
            k = rng.randint(0, cap + 2)
            values = list(range(counter + 1, counter + 1 + k))
            counter += k
            log.append(("extend", k))
            if model.never_insert(k):
                _refused(rb, lambda b, v=values: b.extend(subject.batch(v)), ValueError)
            elif model.can_insert(k):
                slots = rb.extend(subject.batch(values))
                assert slots.numel() == k, where
                model.write(values)
            else:
                err = _refused(rb, lambda b, v=values: b.extend(subject.batch(v)))
                assert err.operation == "insert", where
        elif op in ("sample", "bad_sample"):
            n = rng.randint(1, 8)
            log.append((op, n))
            if model.never(n):
                _refused(rb, lambda b, n=n: b.sample(n), ValueError)
            elif not model.can_sample(n):
                err = _refused(rb, lambda b, n=n: b.sample(n))
                assert err.operation == "sample", where
            elif op == "bad_sample":  # allowed, then fails in collate: not counted
                rb.collate_fn.at = rb.collate_fn.calls
                _refused(rb, lambda b, n=n: b.sample(n), RuntimeError)
            else:
                data = rb.sample(n)
                got = subject.values(data)
                assert len(got) == n and set(got) <= set(model.slots), where
                model.samples += n
        elif op == "query":
            log.append(("query",))
        elif op == "empty":
            log.append(("empty",))
            rb.empty()
            model.empty()
        elif op == "restore":
            # (dumps fsyncs its files: at most one a history keep the file fast)
            how = rng.choice([h for h in RESTORES if h != "dumps" or not dumps])
            dumps += how == "dumps"
            log.append(("restore", how))
            rb = restored(rb, subject.make, how, keep)
        elif op == "bad_write":
            k = rng.randint(1, 3)
            bad = subject.bad_batch(k)
            log.append(("bad_write", k))
            if bad is None or not model.can_insert(k) or not len(rb):
                continue  # (a LazyTensorStorage takes its layout from its first write)
            _refused(rb, lambda b, bad=bad: b.extend(bad), (ValueError, TypeError, KeyError))
        _agree(rb, model, subject, rng, where)
    return model


SEEDS = range(56)


@pytest.mark.parametrize("seed", SEEDS)
def test_random_history_agrees_with_the_model(seed):
    config = CONFIGS[seed % len(CONFIGS)]
    limiter_kind = LIMITERS[(seed // len(CONFIGS)) % len(LIMITERS)]
    run_history(seed, config, limiter_kind)


# ---- threads ---------------------------------------------------------------------------------
@pytest.mark.parametrize("storage", ["list", "lazy"])
def test_a_writer_and_a_sampler_thread_keep_the_rule(storage):
    s, m, lo, hi = 1.0, 4, 0.0, 8.0
    limiter = SampleToInsertRatio(s, m, (lo, hi), timeout=5)
    cap = 16
    rb = ReplayBuffer(storage=ListStorage(cap) if storage == "list" else LazyTensorStorage(cap),
                      rate_limiter=limiter)
    total, batch = 300, 2
    errors: list = []
    seen: list = []

    def writer():
        rng = random.Random(0)
        written = 0
        try:
            while written < total:
                k = min(rng.randint(1, 3), total - written)
                values = list(range(written, written + k))
                rb.extend(values if storage == "list" else torch.tensor(values))
                written += k
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    def sampler():
        try:
            while limiter.samples + batch <= total * s:
                rb.sample(batch)
                seen.append((limiter.inserts, limiter.samples))
        except BaseException as err:  # pragma: no cover
            errors.append(err)

    threads = [threading.Thread(target=writer), threading.Thread(target=sampler)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not any(thread.is_alive() for thread in threads), "deadlock"
    assert not errors, errors
    assert (limiter.inserts, limiter.samples) == (total, total)
    assert (len(rb), rb.write_count) == (cap, total)
    diff = limiter.inserts * s - limiter.samples
    assert lo <= diff <= hi
    # each sample was allowed: the samples never ran ahead of the inserts beyond min_diff
    assert all(inserts * s - samples >= lo for inserts, samples in seen)
