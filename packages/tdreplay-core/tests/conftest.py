"""Shared fixtures of the tdreplay-core tests: a buffer's whole state before and after a call
(:mod:`tdreplay.core.testing`)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import pytest

from tdreplay.core.testing import assert_same, buffer_snapshot


@pytest.fixture
def unchanged():
    """``with unchanged(rb): <bad call>`` asserts the buffer's whole state is as before."""

    @contextmanager
    def _check(rb: Any):
        before = buffer_snapshot(rb)
        yield
        assert_same(buffer_snapshot(rb), before, "buffer state")

    return _check


@pytest.fixture
def same():
    """``same(a, b)``: structural equality of nested lists/dicts/tensors/TensorDicts."""
    return assert_same
