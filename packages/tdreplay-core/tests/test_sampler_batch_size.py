"""Samplers that need a batch size known in advance (``Sampler.requires_batch_size``): a buffer
without ``batch_size`` refuses them, at construction and in ``set_sampler``, as TorchRL."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tdreplay.core import ListStorage, RandomSampler, ReplayBuffer, Sampler, Storage

MESSAGE = "Samplers with drop_last=True must work with a predictable batch-size"


class _NeedsBatchSize(RandomSampler):
    @property
    def requires_batch_size(self) -> bool:
        return True


def test_default_is_false() -> None:
    assert RandomSampler().requires_batch_size is False


def test_construction_without_batch_size_is_refused() -> None:
    with pytest.raises(ValueError, match=MESSAGE):
        ReplayBuffer(storage=ListStorage(10), sampler=_NeedsBatchSize())


def test_construction_with_batch_size_works() -> None:
    rb = ReplayBuffer(storage=ListStorage(10), sampler=_NeedsBatchSize(), batch_size=3)
    rb.extend(torch.arange(10))
    assert rb.sample().shape == (3,)


def test_set_sampler_without_batch_size_is_refused_and_keeps_the_sampler() -> None:
    rb = ReplayBuffer(storage=ListStorage(10))
    previous = rb.sampler
    with pytest.raises(ValueError, match=MESSAGE):
        rb.set_sampler(_NeedsBatchSize())
    assert rb.sampler is previous
    rb.extend(torch.arange(4))
    assert rb.sample(2).shape == (2,)


def test_set_sampler_with_batch_size_works() -> None:
    rb = ReplayBuffer(storage=ListStorage(10), batch_size=2)
    new = _NeedsBatchSize()
    assert rb.set_sampler(new) is not new
    assert rb.sampler is new


def test_a_sampler_that_does_not_require_it_needs_no_batch_size() -> None:
    class Plain(Sampler):
        def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict[str, Any]]:
            return torch.zeros(batch_size, dtype=torch.long), {}

    rb = ReplayBuffer(storage=ListStorage(10), sampler=Plain())
    rb.extend(torch.arange(3) + 5)
    assert rb.sample(2).tolist() == [5, 5]


def test_random_sampler_replacement_false_is_the_sampler_without_replacement() -> None:
    from tdreplay.core import SamplerWithoutReplacement

    s = RandomSampler(replacement=False, drop_last=True, shuffle=False)
    assert type(s) is SamplerWithoutReplacement and s.requires_batch_size
    storage = ListStorage(10)
    storage.set(torch.arange(5), list("abcde"))
    assert [s.sample(storage, 2)[0].tolist() for _ in range(2)] == [[0, 1], [2, 3]]
    assert s.ran_out  # the last item would make an incomplete batch: dropped
    with pytest.raises(ValueError, match=MESSAGE):
        ReplayBuffer(storage=ListStorage(10), sampler=RandomSampler(replacement=False,
                                                                     drop_last=True))
    assert type(RandomSampler(replacement=True)) is RandomSampler
