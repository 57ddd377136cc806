"""Errors about a storage of plain tensors name "the data", not the entry ``'_tensor'`` the
storage keeps it under (a key the user never wrote); one item without dims written to
several rows is a shape error (``ValueError`` and, as TorchRL's, ``RuntimeError``)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ReplayBuffer, TensorDictReplayBuffer
from tdreplay.storages import LazyStackStorage, LazyTensorStorage


def test_a_shape_error_names_the_data():
    rb = ReplayBuffer(storage=LazyTensorStorage(8))
    rb.extend(torch.zeros(4))
    with pytest.raises(ValueError, match=r"^the data has shape \(2,\), expected \(6,\)"):
        rb.storage.set(slice(2, None), torch.ones(2))
    rb2 = ReplayBuffer(storage=LazyTensorStorage(8, ndim=2))
    rb2.extend(torch.zeros(2, 1, 2))
    with pytest.raises(ValueError, match=r"for the data does not fit its entry of shape"):
        rb2[0] = torch.ones(2, 2)
    assert (rb[:] == 0).all() and (rb2[:] == 0).all()


def test_a_lossy_cast_names_the_data():
    rb = ReplayBuffer(storage=LazyTensorStorage(8))
    rb.extend(torch.zeros(4, dtype=torch.int64))
    with pytest.raises(TypeError, match=r"^the data: torch.float32 data written"):
        rb.extend(torch.full((2,), 0.5))
    assert len(rb) == 4


def test_entries_of_tensordicts_are_still_named():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8))
    rb.extend(TensorDict({"obs": torch.zeros(4, 3)}, [4]))
    with pytest.raises(ValueError, match=r"entry 'obs' has shape \(2, 4\)"):
        rb.extend(TensorDict({"obs": torch.zeros(2, 4)}, [2]))


@pytest.mark.parametrize("make", [lambda: LazyTensorStorage(8), lambda: LazyStackStorage(8)])
def test_one_item_without_dims_for_several_rows(make):
    storage = make()
    item = TensorDict({"x": torch.tensor(1.0)}, [])
    with pytest.raises(RuntimeError, match="batch"):  # (TorchRL's error type there)
        storage.set(slice(None, 2), item)
    with pytest.raises(ValueError):
        storage.set([0, 1], item)
    assert len(storage) == 0


def test_a_key_index_of_plain_data_says_the_storage_holds_no_tensordict():
    """``rb["a"]`` named the storage's own entry ``'_tensor'`` (or read a pytree leaf ``"0"``)."""
    rb = ReplayBuffer(storage=LazyTensorStorage(6))
    rb.extend(torch.arange(4.0))
    with pytest.raises(KeyError, match="holds tensor data, not TensorDicts") as info:
        rb["a"]
    assert "_tensor" not in str(info.value)
    tree = ReplayBuffer(storage=LazyTensorStorage(6))
    tree.extend({"x": torch.arange(4.0)})
    with pytest.raises(KeyError, match="holds pytree data, not TensorDicts"):
        tree["0"]
    assert rb[1].item() == 1.0 and tree[1]["x"].item() == 1.0
