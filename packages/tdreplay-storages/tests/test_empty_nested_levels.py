"""A tensor or compressed storage does not keep the empty nested TensorDicts of its data (its
layouts hold tensors); it dropped them without a word, where TorchRL's keep them. It warns
now, naming them; list storages keep them."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ListStorage, TensorDictReplayBuffer
from tdreplay.storages import (
    CompressedListStorage,
    LazyMemmapStorage,
    LazyStackStorage,
    LazyTensorStorage,
)


def with_empty_levels(n: int = 4) -> TensorDict:
    return TensorDict({"a": torch.arange(n), "e": TensorDict({}, [n]),
                       "f": {"g": TensorDict({}, [n])}}, [n])


@pytest.mark.parametrize("make", [LazyTensorStorage, LazyMemmapStorage, CompressedListStorage])
def test_a_storage_of_tensors_warns_of_the_empty_levels_it_drops(make):
    rb = TensorDictReplayBuffer(storage=make(10))
    with pytest.warns(UserWarning, match=r"entries \[\('f', 'g'\), 'e'\] are empty "
                                         r"TensorDicts, which this storage does not keep"):
        rb.extend(with_empty_levels())
    assert sorted(map(str, rb[:].keys(True))) == ["a"]
    assert rb[:]["a"].tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("make", [ListStorage, LazyStackStorage])
def test_list_storages_keep_the_empty_levels(make, recwarn):
    rb = TensorDictReplayBuffer(storage=make(10))
    rb.extend(with_empty_levels())
    assert {"e", "f", ("f", "g")} <= set(rb[:].keys(True))
    assert not [w for w in recwarn if "empty TensorDicts" in str(w.message)]


def test_data_without_empty_levels_does_not_warn(recwarn):
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10))
    rb.extend(TensorDict({"a": torch.arange(4), "n": {"b": torch.ones(4)}}, [4]))
    assert not [w for w in recwarn if "empty TensorDicts" in str(w.message)]
