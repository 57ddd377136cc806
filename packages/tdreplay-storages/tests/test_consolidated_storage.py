"""``LazyTensorStorage(consolidated=True)`` and ``cleanup_memmap`` (TorchRL's arguments)."""

from __future__ import annotations

import copy
import gc
import pickle
import shutil

import pytest
import torch
from tensordict import TensorDict, tensorclass

from tdreplay.core import ReplayBuffer
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage


@tensorclass
class Pair:
    a: torch.Tensor
    b: torch.Tensor


def data(n: int, start: int = 0) -> TensorDict:
    a = torch.arange(start, start + n, dtype=torch.float32)
    return TensorDict({"a": a, ("n", "b"): torch.stack([a, -a], -1).long(),
                       "flag": a > start}, [n])


def buffers(storage: LazyTensorStorage) -> set[int]:
    rows = storage.written_rows()
    return {rows.get(k).untyped_storage().data_ptr() for k in rows.keys(True, True)}


def test_default_is_not_consolidated():
    storage = LazyTensorStorage(10)
    assert storage.consolidated is False and storage.cleanup_memmap is True
    storage.set(slice(0, 2), data(2))
    assert len(buffers(storage)) == 3


def test_consolidated_storage_holds_every_entry_in_one_buffer():
    storage = LazyTensorStorage(10, consolidated=True)
    assert storage.consolidated is True
    storage.set(slice(0, 3), data(3))
    assert len(buffers(storage)) == 1
    assert storage._layout.td.is_consolidated()


def test_consolidated_storage_writes_and_reads_values():
    storage = LazyTensorStorage(6, consolidated=True)
    storage.set(slice(0, 4), data(4))
    storage.set(slice(4, 6), data(2, start=10))
    storage.set(slice(0, 1), data(1, start=20))  # wrap-around overwrite
    out = storage.get(torch.tensor([0, 3, 5]))
    assert out["a"].tolist() == [20.0, 3.0, 11.0]
    assert out["n", "b"].tolist() == [[20, -20], [3, -3], [11, -11]]
    assert out["flag"].tolist() == [False, True, True]
    assert len(buffers(storage)) == 1


def test_buffer_over_a_consolidated_storage_samples_written_values():
    rb = ReplayBuffer(storage=LazyTensorStorage(8, consolidated=True), batch_size=32)
    rb.extend(data(5))
    batch = rb.sample()
    assert set(batch["a"].tolist()) <= {0.0, 1.0, 2.0, 3.0, 4.0}
    assert torch.equal(batch["n", "b"][:, 0], batch["a"].long())


def test_state_dict_and_checkpoints_round_trip_into_consolidated_storages(tmp_path):
    source = LazyTensorStorage(8, consolidated=True)
    source.set(slice(0, 3), data(3, start=1))
    target = LazyTensorStorage(8, consolidated=True)
    target.load_state_dict(source.state_dict())
    assert target[:]["a"].tolist() == [1.0, 2.0, 3.0] and len(buffers(target)) == 1
    rb = ReplayBuffer(storage=source)
    rb.dumps(tmp_path)
    restored = ReplayBuffer(storage=LazyTensorStorage(8, consolidated=True))
    restored.loads(tmp_path)
    assert restored[:]["n", "b"].tolist() == [[1, -1], [2, -2], [3, -3]]
    assert len(buffers(restored.storage)) == 1
    plain = ReplayBuffer(storage=LazyTensorStorage(8))  # same files either way
    plain.loads(tmp_path)
    assert plain[:]["a"].tolist() == [1.0, 2.0, 3.0]


def test_pickle_and_deepcopy_keep_one_buffer():
    storage = LazyTensorStorage(1000, consolidated=True)
    storage.set(slice(0, 2), data(2))
    plain = LazyTensorStorage(1000)
    plain.set(slice(0, 2), data(2))
    blob = pickle.dumps(storage)
    for copied in (pickle.loads(blob), copy.deepcopy(storage)):
        assert copied[:]["a"].tolist() == [0.0, 1.0] and len(buffers(copied)) == 1
        copied.set(0, data(1, start=9)[0])
        assert storage[:]["a"].tolist() == [0.0, 1.0]  # a copy, not a view
    assert len(blob) < 1.5 * len(pickle.dumps(plain))  # the buffer is pickled once


def test_tensorclass_data_is_consolidated():
    storage = LazyTensorStorage(4, consolidated=True)
    storage.set(slice(0, 2), Pair(a=torch.ones(2), b=torch.zeros(2, 3), batch_size=[2]))
    out = storage.get(torch.tensor([1]))
    assert type(out) is Pair and out.a.tolist() == [1.0]
    assert len(buffers(storage)) == 1


def test_a_new_entry_is_added_beside_the_buffer():
    storage = LazyTensorStorage(4, consolidated=True)
    storage.set(slice(0, 2), data(2))
    more = data(1, start=5)
    more["extra"] = torch.ones(1)
    storage.set(slice(2, 3), more)
    assert storage[:]["extra"].tolist() == [0.0, 0.0, 1.0]
    assert storage[:]["a"].tolist() == [0.0, 1.0, 5.0]


@pytest.mark.parametrize("value", [torch.zeros(3, 2), {"a": torch.zeros(3)}])
def test_non_tensordict_data_is_refused_and_nothing_is_written(value):
    storage = LazyTensorStorage(4, consolidated=True)
    with pytest.raises(ValueError, match="Cannot consolidate non-tensordict storages"):
        storage.set(slice(0, 3), value)
    assert not storage.initialized and len(storage) == 0
    assert storage.layout_meta()["kind"] == "tensordict"  # the format is untouched too
    storage.set(slice(0, 1), data(1))  # TensorDicts are still taken
    assert storage[:]["a"].tolist() == [0.0]


def test_loading_tensor_rows_into_an_unwritten_consolidated_storage_is_refused():
    source = LazyTensorStorage(4)
    source.set(slice(0, 2), torch.ones(2, 3))
    target = LazyTensorStorage(4, consolidated=True)
    with pytest.raises(ValueError, match="Cannot consolidate"):
        target.load_state_dict(source.state_dict())
    assert not target.initialized


@pytest.mark.parametrize("name", ["consolidated", "cleanup_memmap"])
@pytest.mark.parametrize("bad", [1, "yes", None])
def test_arguments_must_be_bools(name, bad):
    with pytest.raises(TypeError, match=f"{name} must be a bool"):
        LazyTensorStorage(4, **{name: bad})
    with pytest.raises(TypeError, match=f"{name} must be a bool"):
        LazyTensorStorage(4, shared_init=True, **{name: bad})


# ---- cleanup_memmap (with shared_init) -------------------------------------------------------
def test_shared_storage_files_go_with_the_storage_by_default():
    storage = LazyTensorStorage(4, shared_init=True)
    assert storage.cleanup_memmap is True
    storage.set(slice(0, 2), data(2))
    scratch = storage.scratch_dir
    assert any(p.suffix == ".memmap" for p in scratch.rglob("*"))
    del storage
    gc.collect()
    assert not scratch.exists()


def test_cleanup_memmap_false_keeps_the_shared_files():
    storage = LazyTensorStorage(4, shared_init=True, cleanup_memmap=False)
    assert storage.cleanup_memmap is False and storage.shared_init
    storage.set(slice(0, 2), data(2, start=3))
    scratch = storage.scratch_dir
    del storage
    gc.collect()
    try:
        assert scratch.is_dir()
        reopened = LazyMemmapStorage(4, scratch_dir=scratch, existsok=True)
        assert reopened[:]["a"].tolist() == [3.0, 4.0]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def test_consolidated_has_no_effect_on_a_shared_storage():
    with pytest.warns(UserWarning, match="consolidated=True has no effect"):
        storage = LazyTensorStorage(4, shared_init=True, consolidated=True)
    assert storage.consolidated is True
    storage.set(slice(0, 2), data(2))  # laid out as files, shared
    assert len(buffers(storage)) == 3
    assert storage[:]["a"].tolist() == [0.0, 1.0]


def test_memmap_storage_keeps_torchrl_flags():
    storage = LazyMemmapStorage(4)
    assert storage.consolidated is False and storage.cleanup_memmap is False
