"""Fixtures shared by the sampler tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture
def torch_threads() -> Iterator[None]:
    """Whatever a test sets with ``torch.set_num_threads`` is undone after it."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture
def ids_stored_unchecked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Writes through a buffer skip the slice samplers' ``check_write``, as ids written
    straight into the storage (or by another process) do: for tests of what a sample does
    with refused ids once they are stored."""
    from tdreplay.core import Sampler
    from tdreplay.samplers import SliceSampler

    monkeypatch.setattr(SliceSampler, "check_write", Sampler.check_write)
