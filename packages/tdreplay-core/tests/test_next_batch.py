"""``rb.next()`` (TorchRL's): the next batch of an iteration kept between calls, ``None`` once
an epoch of a finite sampler ends, then a new epoch."""

from __future__ import annotations

import pickle

import pytest
import torch

from tdreplay.core import ListStorage, RandomSampler, ReplayBuffer, SamplerWithoutReplacement


def make(sampler, batch_size=3) -> ReplayBuffer:
    rb = ReplayBuffer(storage=ListStorage(8), sampler=sampler, batch_size=batch_size,
                      generator=torch.Generator().manual_seed(0))
    rb.extend(list(range(7)))
    return rb


def test_an_epoch_of_a_finite_sampler_then_none_then_a_new_epoch():
    rb = make(SamplerWithoutReplacement())
    epoch = [rb.next(), rb.next(), rb.next()]
    assert [len(batch) for batch in epoch] == [3, 3, 1]
    assert sorted(sum(epoch, [])) == list(range(7))  # every item once
    assert rb.next() is None
    again = [rb.next(), rb.next(), rb.next()]
    assert sorted(sum(again, [])) == list(range(7)) and rb.next() is None


def test_an_endless_sampler_never_ends():
    rb = make(RandomSampler())
    batches = [rb.next() for _ in range(20)]
    assert all(len(batch) == 3 and set(batch) <= set(range(7)) for batch in batches)


def test_next_follows_the_buffer_as_it_changes():
    rb = make(SamplerWithoutReplacement(), batch_size=7)
    assert sorted(rb.next()) == list(range(7))
    assert rb.next() is None
    rb.extend([7])
    epoch = [rb.next(), rb.next()]  # 7 items, then the last of the 8
    assert [len(batch) for batch in epoch] == [7, 1]
    assert sorted(sum(epoch, [])) == list(range(8)) and rb.next() is None


def test_a_copy_starts_its_own_iteration():
    rb = make(SamplerWithoutReplacement())
    first = rb.next()
    copy = pickle.loads(pickle.dumps(rb))  # the iteration is not pickled
    rest = [copy.next(), copy.next()]
    assert sorted(first + sum(rest, [])) == list(range(7))  # the sampler's epoch goes on
    assert copy.next() is None
    assert len(rb.next()) == 3  # the original's own iteration, untouched by the copy


def test_without_a_batch_size_next_raises_and_stays_usable():
    rb = ReplayBuffer(storage=ListStorage(4))
    rb.extend([1, 2])
    with pytest.raises(RuntimeError, match="batch_size"):
        rb.next()
    with pytest.raises(RuntimeError, match="batch_size"):
        rb.next()
