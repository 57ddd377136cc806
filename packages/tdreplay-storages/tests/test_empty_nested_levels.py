"""Empty nested TensorDicts of the data (``"e": TensorDict({}, [n])``, a level whose only
entry is one, a level of its own batch dims) are kept by the tensor storages, as TorchRL's:
in what samples and reads give back, across state_dict, pickle, every checkpointer and a
memory-mapped storage reopened from its files. They were dropped (0.6.2 warned of it). A
``CompressedListStorage`` still does not keep them and says so."""

from __future__ import annotations

import pickle

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ListStorage, TensorDictReplayBuffer
from tdreplay.storages import (
    CompressedListStorage,
    FlatStorageCheckpointer,
    H5StorageCheckpointer,
    LazyMemmapStorage,
    LazyStackStorage,
    LazyTensorStorage,
    NestedStorageCheckpointer,
    TensorStorageCheckpointer,
)

LEVELS = {"e": (4,), ("f", "g"): (4,), "x": (4,), ("x", "y"): (4, 2)}


def with_empty_levels(n: int = 4) -> TensorDict:
    return TensorDict({"a": torch.arange(n), "e": TensorDict({}, [n]),
                       "f": {"g": TensorDict({}, [n]), "h": torch.ones(n)},
                       "x": {"y": TensorDict({}, [n, 2])}}, [n])


def assert_levels(td: TensorDict, lead: tuple[int, ...] = (4,)) -> None:
    for key, batch in LEVELS.items():
        level = td.get(key)
        assert isinstance(level, TensorDict), key
        assert list(level.keys()) == (["y"] if key == "x" else []), key
        assert tuple(level.batch_size) == lead + batch[1:], (key, level.batch_size)


@pytest.mark.parametrize("make", [LazyTensorStorage, LazyMemmapStorage])
def test_tensor_storages_keep_the_empty_levels(make, recwarn):
    rb = TensorDictReplayBuffer(storage=make(10), batch_size=3)
    rb.extend(with_empty_levels())
    assert_levels(rb[:])
    assert_levels(rb.sample(), (3,))
    assert rb[:]["a"].tolist() == [0, 1, 2, 3] and rb[:]["f", "h"].tolist() == [1.0] * 4
    assert not [w for w in recwarn if "empty TensorDicts" in str(w.message)]


def test_an_ndim_2_storage_keeps_them_with_both_dims():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(16, ndim=2))
    rb.extend(with_empty_levels(6).reshape(2, 3))
    assert rb[:]["e"].batch_size == (2, 3)
    assert rb[:]["x", "y"].batch_size == (2, 3, 2)
    assert rb.storage[:]["x", "y"].batch_size == (3, 2, 2)  # time-major


@pytest.mark.parametrize("make", [LazyTensorStorage, LazyMemmapStorage])
def test_state_dict_and_pickle_keep_them(make):
    rb = TensorDictReplayBuffer(storage=make(10))
    rb.extend(with_empty_levels())
    restored = TensorDictReplayBuffer(storage=make(10))
    restored.load_state_dict(rb.state_dict())
    assert_levels(restored[:])
    assert_levels(pickle.loads(pickle.dumps(rb))[:])


@pytest.mark.parametrize("checkpointer", [None, TensorStorageCheckpointer,
                                          FlatStorageCheckpointer, NestedStorageCheckpointer,
                                          H5StorageCheckpointer])
def test_every_checkpointer_keeps_them(tmp_path, checkpointer):
    def build():
        storage = LazyTensorStorage(10)
        if checkpointer is not None:
            storage.checkpointer = checkpointer()
        return TensorDictReplayBuffer(storage=storage)

    rb = build()
    rb.extend(with_empty_levels())
    rb.dumps(tmp_path)
    restored = build()
    restored.loads(tmp_path)
    assert_levels(restored[:])
    restored.extend(with_empty_levels())  # the data still fits the restored layout
    assert len(restored) == 8


def test_a_reopened_memmap_storage_keeps_them(tmp_path):
    rb = TensorDictReplayBuffer(storage=LazyMemmapStorage(10, scratch_dir=tmp_path))
    rb.extend(with_empty_levels())
    reopened = LazyMemmapStorage(10, scratch_dir=tmp_path, existsok=True)
    assert len(reopened) == 4
    assert_levels(reopened[:])


def test_compressed_storage_warns_of_the_empty_levels_it_drops():
    rb = TensorDictReplayBuffer(storage=CompressedListStorage(10))
    with pytest.warns(UserWarning, match=r"entries \[\('f', 'g'\), \('x', 'y'\), 'e'\] are "
                                         r"empty TensorDicts, which this storage does not keep"):
        rb.extend(with_empty_levels())
    assert sorted(map(str, rb[:].keys(True))) == ["('f', 'h')", "a", "f"]


@pytest.mark.parametrize("make", [ListStorage, LazyStackStorage])
def test_list_storages_keep_the_empty_levels(make, recwarn):
    rb = TensorDictReplayBuffer(storage=make(10))
    rb.extend(with_empty_levels())
    assert {"e", "f", ("f", "g")} <= set(rb[:].keys(True))
    assert not [w for w in recwarn if "empty TensorDicts" in str(w.message)]


def test_data_without_empty_levels_does_not_warn(recwarn):
    rb = TensorDictReplayBuffer(storage=CompressedListStorage(10))
    rb.extend(TensorDict({"a": torch.arange(4), "n": {"b": torch.ones(4)}}, [4]))
    assert not [w for w in recwarn if "empty TensorDicts" in str(w.message)]
