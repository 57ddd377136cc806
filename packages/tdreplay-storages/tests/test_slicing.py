"""Every storage indexes only its written rows: ``len(rb[10:])`` before the buffer is full."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ListStorage, ReplayBuffer
from tdreplay.storages import (
    CompressedListStorage,
    LazyMemmapStorage,
    LazyStackStorage,
    LazyTensorStorage,
    TensorStorage,
)

CAPACITY = 30

FACTORIES = {
    "ListStorage": lambda tmp: ListStorage(CAPACITY),
    "LazyStackStorage": lambda tmp: LazyStackStorage(CAPACITY),
    "TensorStorage": lambda tmp: TensorStorage(None, CAPACITY),
    "LazyTensorStorage": lambda tmp: LazyTensorStorage(CAPACITY),
    "LazyMemmapStorage": lambda tmp: LazyMemmapStorage(CAPACITY, scratch_dir=tmp),
    "CompressedListStorage": lambda tmp: CompressedListStorage(CAPACITY),
}


def data(n: int) -> TensorDict:
    return TensorDict({"x": torch.arange(n), ("nested", "y"): torch.arange(n).float()}, [n])


def values(batch) -> list[int]:
    return batch["x"].tolist() if not isinstance(batch, list) else [b["x"].item() for b in batch]


@pytest.fixture(params=sorted(FACTORIES))
def rb(request, tmp_path):
    buffer = ReplayBuffer(storage=FACTORIES[request.param](tmp_path))
    buffer.extend(data(15))
    return buffer


@pytest.mark.parametrize(
    ("index", "expected"),
    [
        (slice(10, None), list(range(10, 15))),
        (slice(None, 100), list(range(15))),
        (slice(20, None), []),
        (slice(None), list(range(15))),
        (slice(-3, None), [12, 13, 14]),
        (slice(None, None, 4), [0, 4, 8, 12]),
        (slice(14, 16), [14]),
    ],
)
def test_slices_count_written_rows_only(rb, index, expected):
    batch = rb[index]
    assert len(batch) == len(expected)
    if expected:
        assert values(batch) == expected


def test_negative_int_is_the_last_written_row(rb):
    assert rb[-1]["x"].item() == 14
    assert rb[0]["x"].item() == 0


def test_int_past_the_written_rows_raises(rb):
    with pytest.raises(IndexError):
        rb[15]


def test_after_wrap_around_slices_cover_the_capacity(tmp_path):
    for name, factory in FACTORIES.items():
        buffer = ReplayBuffer(storage=factory(tmp_path / name))
        buffer.extend(data(CAPACITY + 5))
        assert len(buffer[10:]) == CAPACITY - 10, name
        assert values(buffer[:2]) == [30, 31], name
