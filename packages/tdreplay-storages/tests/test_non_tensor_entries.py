"""Non-tensor entries (strings and other objects, ``NonTensorData`` / ``NonTensorStack``) in a
TensorDict written to a tensor storage: refused by name, nothing written. tensordict's
``leaves_only`` keys leave them out, so they used to be dropped without a word."""

from __future__ import annotations

import re

import pytest
import torch
from tensordict import NonTensorStack, TensorDict

from tdreplay.core import ReplayBuffer, TensorDictReplayBuffer
from tdreplay.core.testing import assert_same, buffer_snapshot
from tdreplay.storages import LazyMemmapStorage, LazyStackStorage, LazyTensorStorage


@pytest.fixture(params=["tensor", "memmap"])
def make_storage(request, tmp_path):
    if request.param == "tensor":
        return lambda: LazyTensorStorage(8)
    return lambda: LazyMemmapStorage(8, scratch_dir=tmp_path)


def _batch(n, **extra):
    return TensorDict({"x": torch.arange(float(n)), **extra}, [n])


@pytest.mark.parametrize("entry", [
    {"p": "a"},
    {("n", "q"): "deep"},
])
def test_the_first_item_with_a_string_is_refused_by_name(make_storage, entry):
    rb = TensorDictReplayBuffer(storage=make_storage())
    item = TensorDict({"x": torch.tensor(1.0)}, [])
    for key, value in entry.items():
        item[key] = value
    name = next(iter(entry))
    with pytest.raises(TypeError, match=re.escape(f"entry {name!r} is a NonTensorData")):
        rb.add(item)
    assert len(rb) == 0 and rb.write_count == 0 and not rb.storage.initialized


def test_a_batch_with_a_string_column_is_refused_by_name(make_storage):
    rb = ReplayBuffer(storage=make_storage())
    with pytest.raises(TypeError, match="entry 'p' is a NonTensorStack"):
        rb.extend(_batch(3, p=NonTensorStack("a", "b", "c")))
    assert len(rb) == 0 and not rb.storage.initialized


def test_a_string_column_after_the_first_write_changes_nothing(make_storage):
    rb = TensorDictReplayBuffer(storage=make_storage())
    rb.extend(_batch(3))
    before = buffer_snapshot(rb)
    with pytest.raises(TypeError, match="entry 'p' is a NonTensorStack"):
        rb.extend(_batch(2, p=NonTensorStack("a", "b")))
    assert_same(buffer_snapshot(rb), before)
    assert rb[:]["x"].tolist() == [0.0, 1.0, 2.0]


def test_a_storage_of_objects_keeps_them():
    rb = TensorDictReplayBuffer(storage=LazyStackStorage(8))
    for i in range(3):
        rb.add(TensorDict({"p": "abc"[i], "x": torch.tensor(float(i))}, []))
    assert [rb[i]["p"] for i in range(3)] == ["a", "b", "c"]
