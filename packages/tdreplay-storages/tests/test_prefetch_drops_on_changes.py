"""Batches drawn ahead (``prefetch``) are dropped when what they were drawn from changes:
a restore through another buffer of the storage (they held rows it replaced), a transform
appended or inserted (they had not gone through it), a new generator (they came from the
old one)."""

from __future__ import annotations

import copy

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ListStorage, TensorDictReplayBuffer
from tdreplay.storages import CompressedListStorage, LazyTensorStorage


def _td(start: int, stop: int) -> TensorDict:
    return TensorDict({"x": torch.arange(start, stop).float()}, [stop - start])


@pytest.mark.parametrize("make", [lambda: LazyTensorStorage(16), lambda: ListStorage(16),
                                  lambda: CompressedListStorage(16)])
def test_a_restore_through_another_buffer(make):
    storage = make()
    writer = TensorDictReplayBuffer(storage=storage, batch_size=4)
    writer.extend(_td(0, 8))
    state = copy.deepcopy(writer.state_dict())
    writer.empty()
    writer.extend(_td(100, 108))
    reader = TensorDictReplayBuffer(storage=storage, batch_size=4, prefetch=3)
    reader.sample()  # batches of rows 100.. drawn ahead
    writer.load_state_dict(state)
    for _ in range(5):
        assert (reader.sample()["x"] < 100).all()


def test_a_transform_appended_or_inserted():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(16), batch_size=4, prefetch=3)
    rb.extend(_td(0, 8))
    rb.sample()

    def with_y(data):
        data["y"] = data["x"] * 2
        return data

    rb.append_transform(with_y)
    assert all("y" in rb.sample().keys() for _ in range(4))

    def with_z(data):
        data["z"] = data["x"] * 3
        return data

    rb.insert_transform(0, with_z)
    assert all("z" in rb.sample().keys() for _ in range(4))


def test_a_new_generator():
    def draws(prefetch: int) -> list[list[int]]:
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), batch_size=4,
                                    prefetch=prefetch)
        rb.extend(_td(0, 100))
        rb.sample()
        rb.set_rng(torch.Generator().manual_seed(7))
        return [rb.sample()["index"].tolist() for _ in range(4)]

    assert draws(3) == draws(0)
