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
