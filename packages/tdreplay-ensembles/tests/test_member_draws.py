"""How an ensemble asks its buffers for their parts, as TorchRL 0.14.1's ``SamplerEnsemble``:
each buffer drawn is sampled once for all its parts, buffers in the order of their ids (so a
seed draws what TorchRL's draws), and a sampler that gives fewer items than asked (the end of
a ``SamplerWithoutReplacement`` epoch) is asked again, so every part is full; ``p="sampleable"``
weighs the buffers by what they can give."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import RandomSampler, SamplerWithoutReplacement, TensorDictReplayBuffer
from tdreplay.ensembles import ReplayBufferEnsemble
from tdreplay.storages import LazyTensorStorage


def _ensemble(*sizes, sampler=SamplerWithoutReplacement, **kwargs):
    rbs = [TensorDictReplayBuffer(storage=LazyTensorStorage(10), sampler=sampler())
           for _ in sizes]
    for k, (rb, size) in enumerate(zip(rbs, sizes)):
        if size:
            rb.extend(TensorDict({"obs": torch.arange(size) + 10.0 * k}, [size]))
    return ReplayBufferEnsemble(*rbs, generator=torch.Generator().manual_seed(0), **kwargs)


def test_every_part_is_full_across_epochs_of_a_sampler_without_replacement():
    """Before: three batches of four were lists of parts of 2 and 1 items."""
    rb = _ensemble(3, 3, p=[1.0, 1.0])
    for _ in range(20):
        sample = rb.sample(4)
        assert isinstance(sample, TensorDict) and sample.batch_size == (2, 2)
        ids = sample["index", "buffer_ids"][:, 0].tolist()
        for part, buffer_id in zip(sample["obs"], ids):
            assert ((part >= 10 * buffer_id) & (part < 10 * buffer_id + 3)).all()


def test_one_part_of_a_buffer_tops_up_from_its_next_epoch():
    rb = _ensemble(3, 3, num_buffer_sampled=1)
    seen = {0: [], 1: []}
    for _ in range(6):
        sample = rb.sample(2)
        assert sample.batch_size == (1, 2)  # (before: (1, 1) at the end of an epoch)
        seen[int(sample["index", "buffer_ids"][0, 0])] += sample["index", "index"][0].tolist()
    for slots in seen.values():  # each epoch of a buffer gives each of its items once
        for epoch in range(len(slots) // 3):
            assert sorted(slots[3 * epoch:3 * epoch + 3]) == [0, 1, 2]


def test_each_buffer_drawn_is_asked_once_in_the_order_of_the_ids():
    """A draw [1, 0, 1] asks buffer 0 for one part, then buffer 1 for two, in one call each
    (TorchRL's order: a seed draws the same items from the same members' streams)."""
    calls = []

    class Recording(RandomSampler):
        def sample(self, storage, batch_size):
            calls.append((self.buffer_id, batch_size))
            return super().sample(storage, batch_size)

    rb = _ensemble(8, 8, sampler=Recording, num_buffer_sampled=3)
    for k in range(2):
        rb[k].sampler.buffer_id = k
    orders = set()
    for _ in range(30):
        calls.clear()
        sample = rb.sample(6)
        drawn = sample["index", "buffer_ids"][:, 0].tolist()
        assert calls == [(k, 2 * drawn.count(k)) for k in sorted(set(drawn))]
        for part, buffer_id in zip(sample["obs"], drawn):  # each part from its buffer
            assert ((part >= 10 * buffer_id) & (part < 10 * buffer_id + 8)).all()
        orders.add(tuple(drawn))
    assert any(list(order) != sorted(order) for order in orders)  # (unsorted draws were met)


def test_sampleable_weighs_the_buffers_by_what_they_can_give():
    rb = _ensemble(0, 4, 1, sampler=RandomSampler, p="sampleable", num_buffer_sampled=1)
    assert rb.sampler.p == "sampleable"
    drawn = [int(rb.sample(2)["index", "buffer_ids"][0, 0]) for _ in range(400)]
    assert 0 not in drawn  # empty: never drawn
    share = drawn.count(1) / len(drawn)
    assert 0.7 < share < 0.9  # 4 items against 1: 0.8
    empty = _ensemble(0, 0, sampler=RandomSampler, p="sampleable")
    with pytest.raises(RuntimeError, match="none of the ensemble's buffers can give a part"):
        empty.sample(2)
    assert rb[[1, 2]].sampler.p == "sampleable"  # (a selection keeps it)


def test_a_sampler_giving_more_than_asked_is_refused():
    class Greedy(RandomSampler):
        def sample(self, storage, batch_size):
            return torch.zeros(batch_size + 1, dtype=torch.long), {}

    rb = _ensemble(3, 3, sampler=Greedy, num_buffer_sampled=1)
    with pytest.raises(RuntimeError, match=r"gave 3 items for a request of 2 \(Greedy hands "
                                           r"out several rows an item, as the frame-stacking"):
        rb.sample(2)
