"""``rb.can_sample()`` as TorchRL's: of the buffer's batch size by default, asking the
sampler (``Sampler.can_sample``, which a custom sampler may override) and the rate limiter."""

from __future__ import annotations

import pytest
import torch

from tdreplay.core import ListStorage, RandomSampler, ReplayBuffer, SamplerWithoutReplacement
from tdreplay.core.rate_limit import MinSize


class EvenOnly(RandomSampler):
    """A sampler that draws only from an even number of items (a TorchRL-style override)."""

    def can_sample(self, storage, batch_size: int) -> bool:
        return len(storage) > 0 and len(storage) % 2 == 0


def test_the_buffers_batch_size_by_default_and_an_error_without_one():
    rb = ReplayBuffer(storage=ListStorage(4), batch_size=2)
    assert rb.can_sample() is False
    rb.extend([1])
    assert rb.can_sample() is True and rb.can_sample(3) is True
    with pytest.raises(RuntimeError, match="batch_size not specified"):
        ReplayBuffer(storage=ListStorage(4)).can_sample()


def test_the_samplers_answer_is_asked():
    rb = ReplayBuffer(storage=ListStorage(4), sampler=EvenOnly(), batch_size=1)
    rb.extend([1])
    assert rb.can_sample() is False
    rb.extend([2])
    assert rb.can_sample() is True


def test_the_rate_limiter_still_has_its_say():
    rb = ReplayBuffer(storage=ListStorage(4), batch_size=1, rate_limiter=MinSize(3, timeout=0))
    rb.extend([1, 2])
    assert rb.sampler.can_sample(rb.storage, 1) is True
    assert rb.can_sample() is False
    rb.extend([torch.tensor(3)])
    assert rb.can_sample() is True


def test_without_replacement_and_drop_last_a_whole_batch_is_needed():
    # TorchRL 0.14.1: False with 3 items and a batch of 8 under drop_last, True without it
    rb = ReplayBuffer(storage=ListStorage(10), sampler=SamplerWithoutReplacement(drop_last=True),
                      batch_size=8)
    rb.extend([1, 2, 3])
    assert rb.can_sample() is False and rb.can_sample(3) is True
    rb.sampler.drop_last = False
    assert rb.can_sample() is True
