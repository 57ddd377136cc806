"""Save and load hooks registered on storage checkpointers (TorchRL's
``StorageCheckpointerBase.register_save_hook`` / ``register_load_hook``), through the storage and
through the buffer; what the hooks receive; atomicity when a hook raises."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict, TensorDictBase

from tdreplay.core import CheckpointError, ListStorage, ReplayBuffer, StorageCheckpointerBase
from tdreplay.core.checkpoint import LOCK_NAME, POINTER_NAME, verify_checkpoint
from tdreplay.storages import (
    CompressedListStorage,
    FlatStorageCheckpointer,
    H5StorageCheckpointer,
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorageCheckpointer,
    NestedStorageCheckpointer,
    TensorStorageCheckpointer,
)

TENSOR_CHECKPOINTERS = [TensorStorageCheckpointer, FlatStorageCheckpointer,
                        NestedStorageCheckpointer, H5StorageCheckpointer]


def written_files(root: Path) -> list[str]:
    """What a save left under ``root`` besides the checkpoint's pointer and lock file."""
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                  if p.name not in (POINTER_NAME, LOCK_NAME))


def rows(n: int, start: float = 0.0) -> TensorDict:
    obs = torch.arange(start, start + n + 1).unsqueeze(-1)
    return TensorDict({"obs": obs[:-1], ("next", "obs"): obs[1:],
                       ("next", "done"): torch.zeros(n, 1, dtype=torch.bool)}, [n])


def times(k: float):
    def hook(td: TensorDictBase) -> TensorDictBase:
        out = td.clone()
        out["obs"] = out["obs"] * k
        return out
    return hook


def plus(k: float):
    def hook(td: TensorDictBase) -> TensorDictBase:
        out = td.clone()
        out["obs"] = out["obs"] + k
        return out
    return hook


# ---- registration ------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [*TENSOR_CHECKPOINTERS, ListStorageCheckpointer])
def test_every_checkpointer_registers_hooks_in_order(cls):
    ckpt = cls()
    first, second, loader = times(2), plus(1), plus(-1)
    ckpt.register_save_hook(first)
    ckpt.register_save_hook(second)
    ckpt.register_load_hook(loader)
    assert ckpt.save_hooks == (first, second)
    assert ckpt.load_hooks == (loader,)
    assert cls().save_hooks == () and cls().load_hooks == ()  # per instance, not shared


def test_storage_registration_forwards_to_its_checkpointer():
    ckpt = TensorStorageCheckpointer()
    storage = LazyTensorStorage(4, checkpointer=ckpt)
    hook, loader = times(3), plus(1)
    storage.register_save_hook(hook)
    storage.register_load_hook(loader)
    assert ckpt.save_hooks == (hook,) and ckpt.load_hooks == (loader,)
    assert storage.save_hooks == (hook,) and storage.load_hooks == (loader,)


def test_buffer_registration_reaches_the_storage_checkpointer():
    storage = LazyTensorStorage(4)
    rb = ReplayBuffer(storage=storage)
    hook = times(3)
    rb.register_save_hook(hook)
    assert storage.checkpointer.save_hooks == (hook,)


def test_another_checkpointer_leaves_the_hooks_with_the_old_one(tmp_path):
    storage = LazyTensorStorage(4)
    old = storage.checkpointer
    storage.register_save_hook(times(10))
    storage.checkpointer = TensorStorageCheckpointer()
    assert len(old.save_hooks) == 1 and storage.save_hooks == ()
    storage.set(slice(0, 2), rows(2))
    storage.dumps(tmp_path)
    target = LazyTensorStorage(4)
    target.loads(tmp_path)
    assert target[:]["obs"].flatten().tolist() == [0.0, 1.0]  # no hook ran


@pytest.mark.parametrize("bad", [None, 3, "hook"])
def test_a_hook_that_is_not_callable_is_refused_naming_it(bad):
    storage = LazyTensorStorage(4)
    for register in (storage.register_save_hook, storage.register_load_hook,
                     storage.checkpointer.register_save_hook):
        with pytest.raises(TypeError, match="hook must be callable"):
            register(bad)
    assert storage.save_hooks == () and storage.load_hooks == ()


def test_checkpointer_subclass_without_base_init_still_takes_hooks(tmp_path):
    class Mine(TensorStorageCheckpointer):
        def __init__(self, tag: str) -> None:  # (does not call the base __init__)
            self.tag = tag

    ckpt = Mine("x")
    ckpt.register_save_hook(times(5))
    storage = LazyTensorStorage(4, checkpointer=ckpt)
    storage.set(slice(0, 2), rows(2, start=1.0))
    storage.dumps(tmp_path)
    target = LazyTensorStorage(4, checkpointer=Mine("y"))
    target.loads(tmp_path)
    assert target[:]["obs"].flatten().tolist() == [5.0, 10.0]


# ---- what runs, on what ------------------------------------------------------------------------
@pytest.mark.parametrize("cls", TENSOR_CHECKPOINTERS)
def test_hooks_of_each_tensor_checkpointer_change_what_is_saved_and_loaded(tmp_path, cls):
    source = LazyTensorStorage(6, checkpointer=cls())
    source.checkpointer.register_save_hook(times(10))
    source.set(slice(0, 3), rows(3, start=1.0))
    source.dumps(tmp_path)
    assert source[:]["obs"].flatten().tolist() == [1.0, 2.0, 3.0]  # the storage is unchanged
    plain = LazyTensorStorage(6, checkpointer=cls())
    plain.loads(tmp_path)
    assert plain[:]["obs"].flatten().tolist() == [10.0, 20.0, 30.0]
    target = LazyTensorStorage(6, checkpointer=cls())
    target.checkpointer.register_load_hook(plus(1))
    target.loads(tmp_path)
    assert target[:]["obs"].flatten().tolist() == [11.0, 21.0, 31.0]
    assert target[:]["next", "obs"].flatten().tolist() == [2.0, 3.0, 4.0]


def test_list_checkpointer_hooks_run_on_the_items(tmp_path):
    ckpt = ListStorageCheckpointer()
    ckpt.register_save_hook(lambda items: [x * 10 for x in items])
    storage = ListStorage(5, checkpointer=ckpt)
    storage.set(torch.arange(3), [1, 2, 3])
    storage.dumps(tmp_path)
    target = ListStorage(5)
    target.checkpointer.register_load_hook(lambda items: [x + 1 for x in items])
    target.loads(tmp_path)
    assert target[:] == [11, 21, 31]
    assert storage[:] == [1, 2, 3]


def test_save_hooks_get_the_written_rows_and_the_directory_written(tmp_path):
    seen = {}

    def hook(data, path):  # TorchRL's signature: path required
        seen["batch"] = tuple(data.batch_size)
        seen["obs"] = data["obs"].flatten().tolist()
        seen["path"] = Path(path)
        seen["empty_before"] = sorted(os.listdir(path))
        return data

    storage = LazyTensorStorage(8)
    storage.register_save_hook(hook)
    storage.set(slice(0, 3), rows(3))
    storage.dumps(tmp_path / "ckpt")
    assert seen["batch"] == (3,)  # the written rows, not the 8 slots
    assert seen["obs"] == [0.0, 1.0, 2.0]
    assert seen["path"] == verify_checkpoint(tmp_path / "ckpt")  # the snapshot being written
    assert seen["empty_before"] == []  # hooks run before the checkpointer writes


def test_load_hooks_never_get_the_live_storage_as_out(tmp_path):
    seen = {}

    def hook(data, out=...):
        seen["out"] = out
        return data

    source = LazyTensorStorage(4)
    source.set(slice(0, 2), rows(2))
    source.dumps(tmp_path)
    target = LazyTensorStorage(4)
    target.set(slice(0, 1), rows(1, start=7.0))
    target.register_load_hook(hook)
    target.loads(tmp_path)
    assert seen["out"] is None
    assert target[:]["obs"].flatten().tolist() == [0.0, 1.0]


def test_buffer_and_checkpointer_hooks_compose_in_registration_order(tmp_path):
    ckpt = TensorStorageCheckpointer()
    ckpt.register_save_hook(times(10))  # on the checkpointer first
    rb = ReplayBuffer(storage=LazyTensorStorage(8, checkpointer=ckpt))
    rb.register_save_hook(plus(1))  # then through the buffer: runs after
    rb.extend(rows(2, start=1.0))
    rb.dumps(tmp_path)
    restored = ReplayBuffer(storage=LazyTensorStorage(8))
    restored.storage.checkpointer.register_load_hook(times(2))
    restored.register_load_hook(plus(-1))
    restored.loads(tmp_path)
    # saved: x * 10 + 1; loaded: (saved * 2) - 1
    assert restored[:]["obs"].flatten().tolist() == [21.0, 41.0]
    assert restored.write_count == 2


def test_a_buffer_save_hook_path_lies_inside_the_snapshot(tmp_path):
    paths = []

    def hook(data, path=None):
        paths.append(Path(path))
        (Path(path) / "note.txt").write_text("mine")  # a TorchRL hook may write there
        return data

    rb = ReplayBuffer(storage=LazyTensorStorage(8))
    rb.register_save_hook(hook)
    rb.extend(rows(2))
    rb.dumps(tmp_path)
    (snapshot,) = [p for p in tmp_path.iterdir() if p.name.startswith("snapshot-")]
    assert paths == [snapshot / "storage"]
    restored = ReplayBuffer(storage=LazyTensorStorage(8))
    restored.loads(tmp_path)  # the file the hook wrote is part of the verified snapshot
    assert restored[:]["obs"].flatten().tolist() == [0.0, 1.0]


# ---- failures ----------------------------------------------------------------------------------
def test_a_raising_save_hook_keeps_the_previous_buffer_checkpoint_and_the_storage(tmp_path):
    rb = ReplayBuffer(storage=LazyMemmapStorage(8, scratch_dir=tmp_path / "scratch"))
    rb.extend(rows(2))
    rb.dumps(tmp_path / "ckpt")
    rb.extend(rows(3, start=10.0))
    calls = []

    def broken(data):
        calls.append(len(data))
        raise ValueError("hook failed")

    rb.register_save_hook(broken)
    before = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    with pytest.raises(ValueError, match="hook failed"):
        rb.dumps(tmp_path / "ckpt")
    assert calls == [5]
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == before  # no snapshot left
    assert len(rb) == 5 and rb.write_count == 5
    assert rb[:]["obs"].flatten().tolist() == [0.0, 1.0, 10.0, 11.0, 12.0]
    restored = ReplayBuffer(storage=LazyMemmapStorage(8, scratch_dir=tmp_path / "other"))
    restored.loads(tmp_path / "ckpt")  # the previous checkpoint
    assert restored[:]["obs"].flatten().tolist() == [0.0, 1.0]


@pytest.mark.parametrize("cls", TENSOR_CHECKPOINTERS)
def test_a_raising_save_hook_writes_nothing_into_a_storage_checkpoint(tmp_path, cls):
    storage = LazyTensorStorage(4, checkpointer=cls())
    storage.set(slice(0, 2), rows(2))

    def broken(data):
        raise RuntimeError("no")

    storage.register_save_hook(broken)
    with pytest.raises(RuntimeError, match="no"):
        storage.dumps(tmp_path)
    assert written_files(tmp_path) == []
    assert storage[:]["obs"].flatten().tolist() == [0.0, 1.0]


def test_a_save_hook_returning_no_tensordict_is_refused_before_writing(tmp_path):
    storage = LazyTensorStorage(4)
    storage.set(slice(0, 2), rows(2))
    storage.register_save_hook(lambda data: data["obs"])
    with pytest.raises(TypeError, match="returned a Tensor; it saves a TensorDict"):
        storage.dumps(tmp_path)
    assert written_files(tmp_path) == []


@pytest.mark.parametrize("cls", TENSOR_CHECKPOINTERS)
def test_a_raising_load_hook_leaves_the_storage_unchanged(tmp_path, cls):
    source = LazyTensorStorage(4, checkpointer=cls())
    source.set(slice(0, 3), rows(3, start=5.0))
    source.dumps(tmp_path)
    target = LazyTensorStorage(4, checkpointer=cls())
    target.set(slice(0, 1), rows(1, start=-1.0))
    target.register_load_hook(lambda data: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        target.loads(tmp_path)
    assert len(target) == 1 and target[:]["obs"].flatten().tolist() == [-1.0]


def test_a_load_hook_that_breaks_the_layout_is_refused_unchanged(tmp_path):
    source = LazyTensorStorage(4)
    source.set(slice(0, 2), rows(2))
    source.dumps(tmp_path)
    target = LazyTensorStorage(4)
    target.set(slice(0, 1), rows(1, start=3.0))
    target.register_load_hook(lambda data: data.exclude("obs"))
    with pytest.raises(CheckpointError, match="obs"):
        target.loads(tmp_path)
    assert len(target) == 1 and target[:]["obs"].flatten().tolist() == [3.0]


def test_compressed_checkpointer_refuses_hooks_when_registered():
    storage = CompressedListStorage(4)
    for register in (storage.register_save_hook, storage.register_load_hook,
                     storage.checkpointer.register_save_hook):
        with pytest.raises(NotImplementedError, match="runs no hook"):
            register(lambda rows: rows)
    assert storage.save_hooks == () and storage.load_hooks == ()


def test_a_torchrl_style_checkpointer_hook_list_is_the_base_one():
    class TorchRLStyle(StorageCheckpointerBase):
        def dumps(self, storage, path):
            (Path(path) / "x.txt").write_text(str(storage.apply_save_hooks([1])))

    ckpt = TorchRLStyle()
    ckpt.register_save_hook(lambda items: items + [2])
    storage = ListStorage(4, checkpointer=ckpt)
    assert storage.apply_save_hooks([1]) == [1, 2]
