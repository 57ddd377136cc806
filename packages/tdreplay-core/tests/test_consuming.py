"""Consuming buffers (``consume_after_n_samples=``, ``ConsumingSampler``) on core's own parts:
which items are sampled, exhaustion, reuse of consumed slots, restore, refusals, threads."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import (
    ConsumingSampler,
    ListStorage,
    RandomSampler,
    ReplayBuffer,
    RoundRobinWriter,
    SamplerWithoutReplacement,
    TensorDictReplayBuffer,
    Writer,
)


def _items(values):
    return [torch.tensor(v) for v in values]


def _rb(size=5, count=1, batch_size=None, seed=0, **kwargs):
    return ReplayBuffer(storage=ListStorage(size), consume_after_n_samples=count,
                        batch_size=batch_size, generator=torch.Generator().manual_seed(seed),
                        **kwargs)


# ---- what is sampled -------------------------------------------------------------------------
def test_consume_after_one_returns_each_item_once_then_refuses():
    rb = _rb(5, batch_size=3)
    assert isinstance(rb.sampler, ConsumingSampler)
    assert rb.consume_after_n_samples == 1 and rb.sampler.max_sample_count == 1
    rb.extend(_items(range(5)))
    first, info = rb.sample(return_info=True)
    assert len(set(first.tolist())) == 3 and first.tolist() == info["index"].tolist()
    assert len(rb) == 2 and len(rb.storage) == 5 and not rb.sampler.ran_out
    second = rb.sample()
    assert sorted(first.tolist() + second.tolist()) == [0, 1, 2, 3, 4]
    assert len(second) == 2 and len(rb) == 0 and rb.sampler.ran_out
    with pytest.raises(RuntimeError, match="Cannot sample from an empty storage"):
        rb.sample()
    assert rb.stats()["size"] == 0 and not rb.can_sample(1)


def test_consume_after_two_returns_each_item_twice():
    rb = _rb(6, count=2)
    rb.extend(_items(range(6)))
    seen = Counter()
    sizes = []
    while len(rb):
        batch = rb.sample(4).tolist()
        assert len(set(batch)) == len(batch)  # no repeat within a batch
        seen.update(batch)
        sizes.append(len(batch))
    assert seen == {i: 2 for i in range(6)}
    assert sum(sizes) == 12 and sizes[-1] <= 4


def test_sampling_is_uniform_over_what_is_left_and_seeded():
    a, b = _rb(8, batch_size=3, seed=7), _rb(8, batch_size=3, seed=7)
    for rb in (a, b):
        rb.extend(_items(range(8)))
    draws_a = [a.sample().tolist() for _ in range(3)]
    draws_b = [b.sample().tolist() for _ in range(3)]
    assert draws_a == draws_b
    assert sorted(sum(draws_a, [])) == list(range(8))


def test_interleaved_writes_join_the_sampleable_set():
    rb = _rb(10)
    rb.extend(_items([0, 1, 2]))
    first = set(rb.sample(2).tolist())
    assert len(rb) == 1
    rb.extend(_items([3, 4]))
    assert len(rb) == 3
    assert set(rb.sample(10).tolist()) == set(range(5)) - first
    assert len(rb) == 0


def test_add_after_exhaustion_and_ran_out_resets():
    rb = _rb(10)
    rb.extend(_items([0, 1]))
    assert set(rb.sample(2).tolist()) == {0, 1} and rb.sampler.ran_out
    rb.add(torch.tensor(2))
    assert len(rb) == 1 and not rb.sampler.ran_out
    assert rb.sample(1).item() == 2


def test_iteration_stops_when_every_item_is_consumed():
    rb = _rb(5, batch_size=2)
    rb.extend(_items(range(5)))
    batches = [batch.tolist() for batch in rb]
    assert [len(b) for b in batches] == [2, 2, 1]
    assert sorted(sum(batches, [])) == list(range(5))
    rb.extend(_items([7, 8]))
    assert sorted(sum((b.tolist() for b in rb), [])) == [7, 8]


def test_explicit_consuming_sampler_and_tensordict_buffer():
    rb = TensorDictReplayBuffer(storage=ListStorage(6), sampler=ConsumingSampler(2),
                                batch_size=4)
    assert rb.consume_after_n_samples == 2
    rb.extend(TensorDict({"a": torch.arange(3)}, [3]))
    s = rb.sample()
    assert s["index"].numel() == 3 and s["index"].tolist() == s["a"].tolist()
    assert len(rb) == 3
    assert rb.sample()["index"].numel() == 3 and len(rb) == 0


# ---- reuse of consumed slots -----------------------------------------------------------------
def test_writes_fill_consumed_slots_oldest_first_without_moving_the_cursor():
    rb = _rb(5, batch_size=2)
    rb.extend(_items(range(5)))
    consumed = rb.sample(return_info=True)[1]["index"].tolist()
    assert rb.writer.cursor == 0
    written = rb.extend(_items([100, 101]))
    assert written.tolist() == consumed
    assert rb.writer.cursor == 0 and rb.write_count == 7
    assert [rb.storage.get(s).item() for s in consumed] == [100, 101]
    assert len(rb) == 5
    assert rb.sampler.reusable_slots(rb.storage, 5).numel() == 0


def test_a_larger_write_goes_to_the_cursor_after_the_consumed_slots_skipping_them():
    rb = _rb(6, batch_size=2, seed=3)
    rb.extend(_items(range(6)))  # full, cursor back at 0
    a, b = rb.sample().tolist()
    written = rb.extend(_items([10, 11, 12, 13])).tolist()
    fresh = [r for r in range(6) if r not in (a, b)][:2]
    assert written == [a, b, *fresh]
    assert rb.writer.cursor == fresh[-1] + 1
    assert [rb.storage.get(r).item() for r in written] == [10, 11, 12, 13]
    assert len(rb) == 6


def test_add_reuses_the_oldest_consumed_slot():
    rb = _rb(4)
    rb.extend(_items(range(4)))
    first = rb.sample(1).item()
    second = rb.sample(1).item()
    assert rb.add(torch.tensor(50)) == first
    assert rb.add(torch.tensor(51)) == second
    assert rb.writer.cursor == 0 and len(rb) == 4
    assert rb.storage.get(first).item() == 50


def test_reuse_before_the_storage_is_full_appends_after_the_written_rows():
    rb = _rb(10, batch_size=2)
    rb.extend(_items(range(5)))
    consumed = rb.sample().tolist()
    written = rb.extend(_items([100, 101, 102, 103])).tolist()
    assert written == [*consumed, 5, 6]
    assert len(rb.storage) == 7 and len(rb) == 7 and rb.writer.cursor == 7


def test_index_assignment_revives_a_consumed_slot():
    rb = _rb(4)
    rb.extend(_items(range(4)))
    slot = rb.sample(1).item()
    rb[slot] = torch.tensor(99)
    assert len(rb) == 4
    assert rb.sampler.reusable_slots(rb.storage, 4).numel() == 0
    assert rb.extend(_items([7])).tolist() == [0]  # the cursor, no consumed slot left


def test_empty_forgets_consumption():
    rb = _rb(4)
    rb.extend(_items(range(4)))
    rb.sample(3)
    rb.empty()
    assert len(rb) == 0 and rb.sampler.reusable_slots(rb.storage, 4).numel() == 0
    assert rb.extend(_items([5, 6])).tolist() == [0, 1] and len(rb) == 2


# ---- state -----------------------------------------------------------------------------------
def _used_buffer(seed=0):
    rb = _rb(6, count=2, batch_size=4, seed=seed)
    rb.extend(_items(range(6)))
    rb.sample()
    rb.sample()  # some items consumed (sampled twice), some once
    return rb


def test_state_dict_round_trip_samples_and_reuses_the_same():
    rb = _used_buffer()
    restored = _rb(6, count=2, batch_size=4, seed=123)
    restored.load_state_dict(rb.state_dict())
    assert len(restored) == len(rb)
    assert restored.sampler.state_dict()["sample_count"].tolist() == \
        rb.sampler.state_dict()["sample_count"].tolist()
    assert restored.sampler.reusable_slots(restored.storage, 6).tolist() == \
        rb.sampler.reusable_slots(rb.storage, 6).tolist()
    assert restored.sample().tolist() == rb.sample().tolist()
    assert restored.extend(_items([40, 41])).tolist() == rb.extend(_items([40, 41])).tolist()
    assert len(restored) == len(rb)


def test_load_state_dict_copies_the_tensors():
    rb = _used_buffer()
    state = rb.sampler.state_dict()
    other = ConsumingSampler()
    other.load_state_dict(state)
    before = other.state_dict()
    state["sample_count"].fill_(42)
    state["sampleable"].fill_(False)
    state["free_slots"].fill_(-1)
    after = other.state_dict()
    assert all(torch.equal(before[k], after[k])
               for k in ("sample_count", "sampleable", "free_slots"))
    assert other.max_sample_count == 2  # taken from the state, as TorchRL


def test_dumps_loads_round_trip(tmp_path):
    rb = _used_buffer()
    restored = _rb(6, count=2, batch_size=4, seed=5)
    restored.extend(_items([9] * 6))
    rb.dumps(tmp_path / "ckpt")
    restored.loads(tmp_path / "ckpt")
    assert len(restored) == len(rb)
    assert torch.equal(restored[:], rb[:])
    assert restored.sample().tolist() == rb.sample().tolist()
    assert restored.extend(_items([1, 2, 3])).tolist() == rb.extend(_items([1, 2, 3])).tolist()


def test_bad_sampler_state_is_refused_and_changes_nothing():
    rb = _used_buffer()
    good = rb.state_dict()
    before = rb.sampler.state_dict()
    for key, value in (("free_slots", torch.tensor([0, 0])),
                       ("sample_count", torch.zeros(3, dtype=torch.long)),
                       ("sampleable", torch.zeros(6)),
                       ("max_sample_count", 0)):
        bad = {**good, "_sampler": {**good["_sampler"], key: value}}
        with pytest.raises(ValueError, match=key):
            rb.load_state_dict(bad)
    after = rb.sampler.state_dict()
    assert all(torch.equal(before[k], after[k])
               for k in ("sample_count", "sampleable", "free_slots"))
    with pytest.raises(ValueError, match="keys differ"):
        rb.load_state_dict({**good, "_sampler": {}})  # a RandomSampler's state


# ---- refusals --------------------------------------------------------------------------------
class _NoWriteAt(RoundRobinWriter):
    supports_write_at = False


def test_bad_arguments_name_the_argument():
    with pytest.raises(ValueError, match="consume_after_n_samples must be a positive"):
        ReplayBuffer(consume_after_n_samples=0)
    for bad in (True, "2", 1.5):
        with pytest.raises(TypeError, match="consume_after_n_samples"):
            ReplayBuffer(consume_after_n_samples=bad)
    with pytest.raises(ValueError, match="max_sample_count must be a positive"):
        ConsumingSampler(0)
    with pytest.raises(TypeError, match="max_sample_count"):
        ConsumingSampler(True)
    with pytest.raises(ValueError, match="conflicts"):
        ReplayBuffer(sampler=ConsumingSampler(2), consume_after_n_samples=1)
    with pytest.raises(ValueError, match="only supports the default RandomSampler"):
        ReplayBuffer(sampler=SamplerWithoutReplacement(), consume_after_n_samples=1)
    with pytest.raises(ValueError, match="Prefetching is not supported"):
        ReplayBuffer(batch_size=2, prefetch=1, consume_after_n_samples=1)
    with pytest.raises(ValueError, match="Prefetching is not supported"):
        ReplayBuffer(batch_size=2, prefetch=1, sampler=ConsumingSampler())
    with pytest.raises(TypeError, match="requires a writer with a callable write_at"):
        ReplayBuffer(writer=_NoWriteAt(), consume_after_n_samples=1)
    # the same count is fine, and a RandomSampler's generator carries over
    g = torch.Generator()
    assert ReplayBuffer(sampler=ConsumingSampler(3),
                        consume_after_n_samples=3).consume_after_n_samples == 3
    made = ReplayBuffer(sampler=RandomSampler(), consume_after_n_samples=1, generator=g)
    assert made.sampler.generator is g


def test_set_parts_refuse_what_a_consuming_sampler_cannot_use():
    prefetching = ReplayBuffer(storage=ListStorage(4), batch_size=2, prefetch=1)
    with pytest.raises(ValueError, match="Prefetching is not supported"):
        prefetching.set_sampler(ConsumingSampler())
    assert isinstance(prefetching.sampler, RandomSampler)
    rb = _rb(4)
    with pytest.raises(TypeError, match="write_at"):
        rb.set_writer(_NoWriteAt())
    assert type(rb.writer) is RoundRobinWriter
    rb.set_sampler(RandomSampler())
    assert rb.consume_after_n_samples is None
    rb.extend(_items(range(3)))
    rb.sample(3)
    assert len(rb) == 3  # no longer consuming


def test_writer_hooks():
    storage = ListStorage(5)
    writer = RoundRobinWriter()
    writer.register_storage(storage)
    writer.extend(list("abcde"))
    assert writer.write_at(3, "D") == 3 and writer.cursor == 0
    # a batch as large as the storage overwrites everything: written as extend writes it
    assert writer.extend_reusing(torch.tensor([2]), list("vwxyz")).tolist() == [0, 1, 2, 3, 4]
    assert storage[:] == list("vwxyz")
    with pytest.raises(ValueError, match="rows names 2 rows"):
        writer.extend_reusing(torch.tensor([0, 1]), ["q"])
    with pytest.raises(IndexError):
        writer.write_at(7, "q")
    assert storage[:] == list("vwxyz") and writer.write_count == 11

    class Plain(Writer):
        def add(self, data):
            return 0

        def extend(self, data):
            return torch.arange(len(data))

    plain = Plain()
    assert plain.supports_write_at is False
    assert plain.extend_reusing(torch.zeros(0, dtype=torch.long), [1, 2]).tolist() == [0, 1]
    with pytest.raises(NotImplementedError):
        plain.write_at(0, 1)
    with pytest.raises(NotImplementedError):
        plain.extend_reusing(torch.tensor([0]), [1])


def test_default_sampler_capabilities():
    storage = ListStorage(4)
    storage.set(torch.arange(3), ["a", "b", "c"])
    sampler = RandomSampler()
    assert sampler.max_sample_count is None
    assert sampler.sampleable_count(storage) == 3
    assert sampler.reusable_slots(storage, 3).tolist() == []


# ---- threads ---------------------------------------------------------------------------------
def test_concurrent_samplers_and_a_writer_never_hand_out_an_item_twice():
    n = 400
    rb = ReplayBuffer(storage=ListStorage(n), consume_after_n_samples=1)
    rb.extend(_items(range(n // 2)))
    got: list[list[int]] = [[] for _ in range(4)]

    def learner(out):
        while not (writer_done.is_set() and len(rb) == 0):
            try:
                out.extend(rb.sample(7).tolist())
            except RuntimeError:  # nothing left for now: the writer is behind
                time.sleep(0.001)

    def writer():
        for start in range(n // 2, n, 10):
            rb.extend(_items(range(start, start + 10)))
        writer_done.set()

    writer_done = threading.Event()
    threads = [threading.Thread(target=learner, args=(out,)) for out in got]
    threads.append(threading.Thread(target=writer))
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert len(rb) == 0
    assert sorted(sum(got, [])) == list(range(n))


def test_a_consuming_buffer_never_written_or_emptied_says_it_holds_no_items():
    # it said "every item written has been consumed": nothing was written, or empty() removed it
    rb = _rb(10, count=2, batch_size=3)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="holds no items yet, extend it first"):
            rb.sample()
        rb.extend(_items(range(4)))
        rb.empty()

