"""Storage checkpointers: defaults, swapping, round trips, TED compaction, errors."""

from __future__ import annotations

import builtins
import json
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from tdreplay.core import CheckpointError, ListStorage, ReplayBuffer
from tdreplay.core.checkpoint import verify_checkpoint
from tdreplay.storages import (
    CompressedListStorage,
    CompressedListStorageCheckpointer,
    FlatStorageCheckpointer,
    H5StorageCheckpointer,
    LazyMemmapStorage,
    LazyStackStorage,
    LazyTensorStorage,
    ListStorageCheckpointer,
    NestedStorageCheckpointer,
    TensorStorage,
    TensorStorageCheckpointer,
)

TENSOR_CHECKPOINTERS = {
    "tensor": TensorStorageCheckpointer,
    "flat": FlatStorageCheckpointer,
    "nested": NestedStorageCheckpointer,
    "h5": H5StorageCheckpointer,
}
STORAGES = {
    "lazy": lambda n, tmp, **kw: LazyTensorStorage(n, **kw),
    "memmap": lambda n, tmp, **kw: LazyMemmapStorage(n, scratch_dir=tmp / "scratch", **kw),
}


def ted(n: int, *, episode: int = 4, seed: int = 0) -> TensorDict:
    """TED-like transitions: ("next", "obs") of step t is "obs" of step t+1 within an episode."""
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(n + 1, 3, generator=g)
    done = torch.zeros(n, 1, dtype=torch.bool)
    done[episode - 1::episode] = True
    next_obs = obs[1:].clone()
    root_obs = obs[:-1].clone()
    # after a done, the next step starts from a reset observation
    resets = torch.randn(n, 3, generator=g)
    after_done = torch.cat([torch.zeros(1, dtype=torch.bool), done[:-1, 0]])
    root_obs[after_done] = resets[after_done]
    pixels = (torch.rand(n + 1, 2, 2, generator=g) * 255).to(torch.uint8)
    return TensorDict({
        "obs": root_obs,
        "pixels": pixels[:-1],
        "action": torch.randint(0, 4, (n,), generator=g),
        "done": torch.zeros(n, 1, dtype=torch.bool),
        ("next", "obs"): next_obs,
        ("next", "pixels"): pixels[1:],
        ("next", "done"): done,
        ("next", "reward"): torch.randn(n, 1, generator=g).to(torch.bfloat16),
        ("meta", "step", "t"): torch.arange(n, dtype=torch.int32),
    }, [n])


def assert_same(a: TensorDict, b: TensorDict) -> None:
    assert set(a.keys(True, True)) == set(b.keys(True, True))
    for key in a.keys(True, True):
        x, y = a.get(key), b.get(key)
        assert x.dtype == y.dtype and x.shape == y.shape, key
        assert torch.equal(x.view(torch.uint8) if x.dtype is torch.bool else x,
                           y.view(torch.uint8) if y.dtype is torch.bool else y), key


def test_default_checkpointers():
    assert type(LazyTensorStorage(3).checkpointer) is TensorStorageCheckpointer
    assert type(TensorStorage(None, 3).checkpointer) is TensorStorageCheckpointer
    assert type(LazyMemmapStorage(3).checkpointer) is TensorStorageCheckpointer
    assert type(ListStorage(3).checkpointer) is ListStorageCheckpointer
    assert type(LazyStackStorage(3).checkpointer) is ListStorageCheckpointer
    assert type(CompressedListStorage(3).checkpointer) is CompressedListStorageCheckpointer


def test_checkpointer_can_be_swapped_and_is_checked():
    storage = LazyTensorStorage(3)
    storage.checkpointer = FlatStorageCheckpointer()
    assert isinstance(storage.checkpointer, FlatStorageCheckpointer)
    with pytest.raises(TypeError, match="StorageCheckpointerBase"):
        storage.checkpointer = "flat"


@pytest.mark.parametrize("storage_name", sorted(STORAGES))
@pytest.mark.parametrize("ckpt_name", sorted(TENSOR_CHECKPOINTERS))
def test_round_trip_through_buffer(tmp_path, storage_name, ckpt_name):
    make = STORAGES[storage_name]
    ckpt = TENSOR_CHECKPOINTERS[ckpt_name]
    rb = ReplayBuffer(storage=make(20, tmp_path / "a", checkpointer=ckpt()), batch_size=5)
    data = ted(27)
    rb.extend(data)  # wraps around: rows 0..6 hold the last 7 transitions
    rb.dumps(tmp_path / "ckpt")
    restored = ReplayBuffer(storage=make(20, tmp_path / "b", checkpointer=ckpt()), batch_size=5)
    restored.loads(tmp_path / "ckpt")
    assert len(restored) == 20 and restored.write_count == 27 and restored.writer.cursor == 7
    assert_same(restored[:], rb[:])
    # both continue identically
    more = ted(3, seed=1)
    assert torch.equal(rb.extend(more), restored.extend(more))
    assert_same(restored[:], rb[:])


@pytest.mark.parametrize("ckpt_name", sorted(TENSOR_CHECKPOINTERS))
def test_round_trip_ndim2(tmp_path, ckpt_name):
    ckpt = TENSOR_CHECKPOINTERS[ckpt_name]
    storage = LazyTensorStorage(24, ndim=2, checkpointer=ckpt())
    data = ted(16).reshape(2, 8)
    storage.set(slice(0, 2), data)
    storage.dumps(tmp_path)
    restored = LazyTensorStorage(24, ndim=2, checkpointer=ckpt())
    restored.loads(tmp_path)
    assert restored.shape == torch.Size([3, 8]) and len(restored) == 16
    assert_same(restored[:], data)


@pytest.mark.parametrize("ckpt_name", sorted(TENSOR_CHECKPOINTERS))
@pytest.mark.parametrize("kind", ["tensor", "pytree"])
def test_round_trip_non_tensordict_data(tmp_path, ckpt_name, kind):
    ckpt = TENSOR_CHECKPOINTERS[ckpt_name]
    rb = ReplayBuffer(storage=LazyTensorStorage(10, checkpointer=ckpt()))
    data = torch.arange(12.).reshape(6, 2)
    rb.extend(data if kind == "tensor" else (data, data.long()))
    rb.dumps(tmp_path)
    restored = ReplayBuffer(storage=LazyTensorStorage(10, checkpointer=ckpt()))
    restored.loads(tmp_path)
    if kind == "tensor":
        assert torch.equal(restored[:], data)
    else:
        first, second = restored[:]
        assert torch.equal(first, data) and torch.equal(second, data.long())


@pytest.mark.parametrize("ckpt_name", sorted(TENSOR_CHECKPOINTERS))
def test_empty_storage_round_trip(tmp_path, ckpt_name):
    ckpt = TENSOR_CHECKPOINTERS[ckpt_name]
    LazyTensorStorage(5, checkpointer=ckpt()).dumps(tmp_path)
    restored = LazyTensorStorage(5, checkpointer=ckpt())
    restored.loads(tmp_path)
    assert len(restored) == 0 and not restored.initialized


@pytest.mark.parametrize("ndim", [1, 2])
@pytest.mark.parametrize("ckpt_name", sorted(TENSOR_CHECKPOINTERS))
def test_emptied_storage_round_trip(tmp_path, ckpt_name, ndim):
    # an allocated storage emptied before saving: its checkpoint holds rows of no steps. The
    # compacting checkpointers failed to save it (ndim=2) or saved what they could not read
    # back (flat, ndim=1); the restored buffer must be empty and take the same writes after
    ckpt = TENSOR_CHECKPOINTERS[ckpt_name]
    data = ted(8) if ndim == 1 else ted(8).reshape(2, 4)
    rb = ReplayBuffer(storage=LazyTensorStorage(8, ndim=ndim, checkpointer=ckpt()))
    rb.extend(data)
    rb.empty()
    rb.dumps(tmp_path)
    restored = ReplayBuffer(storage=LazyTensorStorage(8, ndim=ndim, checkpointer=ckpt()))
    restored.loads(tmp_path)
    assert len(restored) == 0
    later = ted(4, seed=1) if ndim == 1 else ted(4, seed=1).reshape(2, 2)
    assert torch.equal(restored.extend(later), rb.extend(later))
    assert_same(restored[:], rb[:])


@pytest.mark.parametrize("ckpt", [FlatStorageCheckpointer, NestedStorageCheckpointer,
                                  H5StorageCheckpointer])
def test_ted_compaction_saves_next_observations_once(tmp_path, ckpt):
    storage = LazyTensorStorage(40, checkpointer=ckpt())
    storage.set(slice(0, 40), ted(40, episode=10))
    storage.dumps(tmp_path)
    meta = json.loads((verify_checkpoint(tmp_path) / "storage.json").read_text())
    entries = {tuple(e["key"]): e for e in meta["entries"]}
    # 4 episodes: the 4th step of each keeps its own next obs, plus the last row
    assert entries[("next", "obs")]["stored"] == "shifted"
    assert entries[("next", "obs")]["explicit"] == 4
    assert entries[("next", "pixels")]["stored"] == "shifted"
    assert entries[("next", "done")]["stored"] == "full"  # done keys are never compacted
    assert entries[("next", "reward")]["stored"] == "full"
    restored = LazyTensorStorage(40, checkpointer=ckpt())
    restored.loads(tmp_path)
    assert_same(restored[:], storage[:])


def test_compaction_is_lossless_when_data_is_not_ted(tmp_path):
    g = torch.Generator().manual_seed(3)
    data = TensorDict({"obs": torch.randn(12, 2, generator=g),
                       ("next", "obs"): torch.randn(12, 2, generator=g),
                       ("next", "other"): torch.randn(12, 2, generator=g)}, [12])
    data["next", "obs"][3] = data["obs"][4]  # one accidental match
    storage = LazyTensorStorage(12, checkpointer=FlatStorageCheckpointer())
    storage.set(slice(0, 12), data)
    storage.dumps(tmp_path)
    restored = LazyTensorStorage(12, checkpointer=FlatStorageCheckpointer())
    restored.loads(tmp_path)
    assert_same(restored[:], data)


def test_compaction_is_bitwise(tmp_path):
    obs = torch.tensor([[0.0], [-0.0], [float("nan")], [1.0]])
    data = TensorDict({"obs": obs, ("next", "obs"): torch.tensor([[-0.0], [float("nan")],
                                                                  [1.0], [2.0]])}, [4])
    storage = LazyTensorStorage(4, checkpointer=FlatStorageCheckpointer())
    storage.set(slice(0, 4), data)
    storage.dumps(tmp_path)
    restored = LazyTensorStorage(4, checkpointer=FlatStorageCheckpointer())
    restored.loads(tmp_path)
    got = restored[:]["next", "obs"]
    assert torch.equal(got.view(torch.int32), data["next", "obs"].view(torch.int32))


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 12), flips=st.lists(st.integers(0, 11), max_size=5),
       ndim=st.sampled_from([1, 2]), seed=st.integers(0, 100))
def test_compaction_round_trip_property(tmp_path_factory, n, flips, ndim, seed):
    data = ted(2 * n, episode=3, seed=seed)
    for i in flips:  # arbitrary edits of next entries break the shift anywhere
        data["next", "obs"][i % (2 * n)] += 1.0
    path = tmp_path_factory.mktemp("ckpt")
    storage = LazyTensorStorage(2 * n, ndim=ndim, checkpointer=FlatStorageCheckpointer())
    rows = data.reshape(2, n) if ndim == 2 else data
    storage.set(slice(0, rows.batch_size[0]), rows)
    storage.dumps(path)
    restored = LazyTensorStorage(2 * n, ndim=ndim, checkpointer=FlatStorageCheckpointer())
    restored.loads(path)
    assert_same(restored[:], rows)


def test_flat_files_are_one_level_and_readable_alone(tmp_path):
    import numpy as np

    storage = LazyTensorStorage(8, checkpointer=FlatStorageCheckpointer())
    data = ted(8)
    storage.set(slice(0, 8), data)
    storage.dumps(tmp_path)
    snapshot = verify_checkpoint(tmp_path)
    assert all(p.is_file() for p in snapshot.iterdir())
    meta = json.loads((snapshot / "storage.json").read_text())
    info = meta["arrays"]["meta.step.t.bin"]
    raw = np.fromfile(snapshot / "meta.step.t.bin", dtype=np.int32)
    assert info["key"] == ["meta", "step", "t"] and raw.tolist() == list(range(8))


def test_nested_layout_mirrors_keys(tmp_path):
    storage = LazyTensorStorage(8, checkpointer=NestedStorageCheckpointer())
    storage.set(slice(0, 8), ted(8))
    storage.dumps(tmp_path)
    snapshot = verify_checkpoint(tmp_path)
    assert (snapshot / "data" / "meta" / "step" / "t.memmap").is_file()
    assert (snapshot / "data" / "next" / "obs@mask.memmap").is_file()


def test_h5_is_one_file_with_groups(tmp_path):
    h5py = pytest.importorskip("h5py")
    storage = LazyTensorStorage(8, checkpointer=H5StorageCheckpointer(checkpoint_file="rb.h5"))
    storage.set(slice(0, 8), ted(8))
    storage.dumps(tmp_path)
    snapshot = verify_checkpoint(tmp_path)
    assert sorted(p.name for p in snapshot.iterdir()) == ["manifest.json", "rb.h5", "seam.json",
                                                          "storage.json"]
    with h5py.File(snapshot / "rb.h5") as f:
        assert f["meta/step/t"][()].tolist() == list(range(8))
        assert "obs@explicit" in f["next"]


def test_h5_kwargs_reach_h5py(tmp_path):
    h5py = pytest.importorskip("h5py")
    ckpt = H5StorageCheckpointer(h5_kwargs={"compression": "gzip", "compression_opts": 4})
    storage = LazyTensorStorage(8, checkpointer=ckpt)
    storage.set(slice(0, 8), ted(8))
    storage.dumps(tmp_path)
    with h5py.File(verify_checkpoint(tmp_path) / "checkpoint.h5") as f:
        assert f["obs"].compression == "gzip"


def test_h5_without_h5py_names_the_extra(monkeypatch):
    real_import = builtins.__import__

    def no_h5py(name, *args, **kwargs):
        if name == "h5py":
            raise ImportError("No module named 'h5py'")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "h5py", raising=False)
    monkeypatch.setattr(builtins, "__import__", no_h5py)
    with pytest.raises(ImportError, match=r"tdreplay-storages\[h5\]"):
        H5StorageCheckpointer()


def test_loading_with_another_checkpointer_says_which_to_set(tmp_path):
    storage = LazyTensorStorage(8, checkpointer=FlatStorageCheckpointer())
    storage.set(slice(0, 4), ted(4))
    storage.dumps(tmp_path)
    for other in (TensorStorageCheckpointer(), NestedStorageCheckpointer()):
        target = LazyTensorStorage(8, checkpointer=other)
        with pytest.raises(CheckpointError, match="FlatStorageCheckpointer"):
            target.loads(tmp_path)
        assert len(target) == 0


def test_tensor_checkpointers_refuse_list_storages(tmp_path):
    storage = ListStorage(4, checkpointer=FlatStorageCheckpointer())
    storage.set(0, torch.zeros(1))
    with pytest.raises(TypeError, match="tensor storages"):
        storage.dumps(tmp_path)


@pytest.mark.parametrize("ckpt_name", sorted(TENSOR_CHECKPOINTERS))
def test_shape_mismatch_is_refused_before_anything_changes(tmp_path, ckpt_name):
    ckpt = TENSOR_CHECKPOINTERS[ckpt_name]
    source = LazyTensorStorage(8, checkpointer=ckpt())
    source.set(slice(0, 4), TensorDict({"obs": torch.ones(4, 3)}, [4]))
    source.dumps(tmp_path)
    target = LazyTensorStorage(8, checkpointer=ckpt())
    target.set(slice(0, 2), TensorDict({"obs": torch.zeros(2, 5)}, [2]))
    with pytest.raises(CheckpointError, match="shape"):
        target.loads(tmp_path)
    assert len(target) == 2 and torch.equal(target[:]["obs"], torch.zeros(2, 5))
    with pytest.raises(CheckpointError, match="max_size"):
        LazyTensorStorage(9, checkpointer=ckpt()).loads(tmp_path)


@pytest.mark.parametrize("ckpt_name", ["flat", "nested", "tensor"])
def test_truncated_array_file_is_reported(tmp_path, ckpt_name):
    # files written plainly (a storage checkpoint of an earlier version, without a manifest):
    # the checkpointer's own checks (storage.dumps's manifest names the file first)
    ckpt = TENSOR_CHECKPOINTERS[ckpt_name]
    storage = LazyTensorStorage(8, checkpointer=ckpt())
    storage.set(slice(0, 8), ted(8))
    storage.write_files(tmp_path)
    victim = (tmp_path / "obs.bin") if ckpt_name == "flat" else (tmp_path / "data" / "obs.memmap")
    victim.write_bytes(victim.read_bytes()[:-4])
    target = LazyTensorStorage(8, checkpointer=ckpt())
    with pytest.raises(CheckpointError, match="bytes"):
        target.loads(tmp_path)
    assert len(target) == 0


def test_save_and_load_hooks_run(tmp_path):
    def double(td):
        td = td.clone()
        td["obs"] *= 2
        return td

    storage = LazyTensorStorage(8, checkpointer=FlatStorageCheckpointer())
    storage.register_save_hook(double)
    storage.set(slice(0, 2), TensorDict({"obs": torch.ones(2, 1)}, [2]))
    storage.dumps(tmp_path)
    target = LazyTensorStorage(8, checkpointer=FlatStorageCheckpointer())
    target.register_load_hook(double)
    target.loads(tmp_path)
    assert target[:]["obs"].flatten().tolist() == [4.0, 4.0]


# ---- list storages ------------------------------------------------------------------------------
@pytest.mark.parametrize("factory", [ListStorage, LazyStackStorage])
def test_list_checkpointer_round_trip(tmp_path, factory):
    rb = ReplayBuffer(storage=factory(5))
    items = [TensorDict({"x": torch.arange(i + 1)}, [i + 1]) for i in range(7)]
    rb.extend(items)
    rb.dumps(tmp_path)
    restored = ReplayBuffer(storage=factory(5))
    restored.loads(tmp_path)
    assert len(restored) == 5 and restored.write_count == 7
    for a, b in zip(rb.storage[:], restored.storage[:]):
        assert torch.equal(a["x"], b["x"])


def test_compressed_checkpointer_round_trip_keeps_blobs(tmp_path):
    rb = ReplayBuffer(storage=CompressedListStorage(6), batch_size=2)
    data = ted(9)
    rb.extend(data)
    rb.dumps(tmp_path)
    restored = ReplayBuffer(storage=CompressedListStorage(6), batch_size=2)
    restored.loads(tmp_path)
    assert len(restored) == 6 and restored.write_count == 9 and restored.writer.cursor == 3
    assert_same(restored[:], rb[:])
    assert [r.blob for r in restored.storage.items()] == [r.blob for r in rb.storage.items()]
    # rows of several structures survive too
    mixed = CompressedListStorage(4)
    mixed.set(0, torch.arange(3))
    mixed.set(1, TensorDict({"a": torch.ones(2, 2)}, [2]))
    mixed.dumps(tmp_path / "mixed")
    back = CompressedListStorage(4)
    back.loads(tmp_path / "mixed")
    assert torch.equal(back.get(0), torch.arange(3)) and back.get(1).batch_size == (2,)


def test_compressed_checkpointer_checks_codec_and_files(tmp_path):
    import zlib

    storage = CompressedListStorage(6)
    storage.set(torch.arange(3), torch.arange(9).reshape(3, 3))
    storage.write_files(tmp_path)  # (plainly, as earlier versions: the checkpointer's checks)
    other = CompressedListStorage(6, compression_fn=zlib.compress, decompression_fn=zlib.decompress)
    with pytest.raises(CheckpointError, match="compressed with"):
        other.loads(tmp_path)
    with pytest.raises(CheckpointError, match="max_size"):
        CompressedListStorage(2).loads(tmp_path)
    blobs = tmp_path / "blobs.bin"
    blobs.write_bytes(blobs.read_bytes()[:-1])
    target = CompressedListStorage(6)
    with pytest.raises(CheckpointError, match="offsets"):
        target.loads(tmp_path)
    assert len(target) == 0


def test_compressed_checkpointer_refuses_hooks(tmp_path):
    storage = CompressedListStorage(3)
    with pytest.raises(RuntimeError, match="hook"):  # (a NotImplementedError)
        storage.register_save_hook(lambda x: x)
    with pytest.raises(NotImplementedError, match="hook="):
        storage.register_load_hook(lambda x: x)
    assert storage.save_hooks == () and storage.load_hooks == ()
    storage.set(0, torch.ones(2))
    storage.dumps(tmp_path)  # nothing was registered: the save runs
