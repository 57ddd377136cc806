"""SamplerWithoutReplacement's epochs as TorchRL's: a storage that changed size starts a new
epoch, and the next epoch is drawn when one runs out."""

from __future__ import annotations

import torch

from tdreplay.core import ListStorage, SamplerWithoutReplacement


def _storage(n: int, capacity: int = 10) -> ListStorage:
    s = ListStorage(capacity)
    s.set(torch.arange(n), list(range(n)))
    return s


def test_growth_mid_epoch_starts_an_epoch_over_every_item() -> None:
    storage = _storage(4)
    sampler = SamplerWithoutReplacement()
    first = sampler.sample(storage, 2)[0]
    storage.set(torch.arange(4, 6), [4, 5])
    epoch = torch.cat([sampler.sample(storage, 2)[0] for _ in range(3)])
    assert sorted(epoch.tolist()) == [0, 1, 2, 3, 4, 5]  # every item once, old ones too
    assert first.numel() == 2 and sampler.ran_out


def test_unchanged_storage_finishes_its_epoch() -> None:
    storage = _storage(6)
    sampler = SamplerWithoutReplacement()
    epoch = torch.cat([sampler.sample(storage, 2)[0] for _ in range(3)])
    assert sorted(epoch.tolist()) == list(range(6)) and sampler.ran_out
    sampler.sample(storage, 2)
    assert not sampler.ran_out


def test_next_epoch_drawn_when_one_runs_out() -> None:
    storage = _storage(3)
    sampler = SamplerWithoutReplacement()
    gen = torch.Generator().manual_seed(0)
    sampler.set_rng(gen)
    for _ in range(3):
        sampler.sample(storage, 1)
    # two permutations drawn so far (the first epoch and the next one): a fresh generator
    # that draws the same two gives the order the next samples follow
    ref = torch.Generator().manual_seed(0)
    torch.randperm(3, generator=ref)
    expected = torch.randperm(3, generator=ref)
    assert torch.cat([sampler.sample(storage, 1)[0] for _ in range(3)]).tolist() \
        == expected.tolist()


def test_state_dict_of_an_exhausted_epoch_restores_the_next_one() -> None:
    storage = _storage(3)
    sampler = SamplerWithoutReplacement()
    for _ in range(3):
        sampler.sample(storage, 1)
    restored = SamplerWithoutReplacement()
    restored.load_state_dict(sampler.state_dict())
    assert restored.ran_out
    assert restored.sample(storage, 3)[0].tolist() == sampler.sample(storage, 3)[0].tolist()
