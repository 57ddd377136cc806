"""Shared helpers of the tdreplay-core tests: snapshots of a buffer's whole state."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tensordict import is_tensor_collection


def _freeze(value: Any) -> Any:
    """A deep copy of ``value`` that later writes to the buffer cannot change."""
    if isinstance(value, torch.Tensor) or is_tensor_collection(value):
        return value.clone()
    if isinstance(value, dict):
        return {k: _freeze(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_freeze(v) for v in value)
    return value


def assert_equal(a: Any, b: Any, where: str = "state") -> None:
    """Structural equality of nested lists/dicts/tensors/TensorDicts, dtypes included."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), where
        assert a.dtype == b.dtype and a.shape == b.shape, f"{where}: {a} vs {b}"
        assert torch.equal(a, b), f"{where}: {a} vs {b}"
    elif is_tensor_collection(a):
        assert is_tensor_collection(b), where
        assert a.batch_size == b.batch_size, where
        keys = sorted(a.keys(True, True), key=str)
        assert keys == sorted(b.keys(True, True), key=str), where
        for key in keys:
            assert_equal(a.get(key), b.get(key), f"{where}[{key!r}]")
    elif isinstance(a, dict):
        assert isinstance(b, dict) and sorted(a) == sorted(b), where
        for k in a:
            assert_equal(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} vs {b!r}"


def buffer_state(rb: Any) -> dict[str, Any]:
    """Everything a bad call must leave unchanged: length, write count, cursor, contents,
    sampler state."""
    return _freeze(
        {
            "len": len(rb),
            "write_count": rb.write_count,
            "writer": rb.writer.state_dict(),
            "sampler": rb.sampler.state_dict(),
            "storage": rb.storage.state_dict(),
        }
    )


@pytest.fixture
def unchanged():
    """``with unchanged(rb): <bad call>`` asserts the buffer's whole state is as before."""
    from contextlib import contextmanager

    @contextmanager
    def _check(rb: Any):
        before = buffer_state(rb)
        yield
        assert_equal(buffer_state(rb), before, "buffer state")

    return _check


@pytest.fixture
def same():
    """``same(a, b)``: structural equality of nested lists/dicts/tensors/TensorDicts."""
    return assert_equal
