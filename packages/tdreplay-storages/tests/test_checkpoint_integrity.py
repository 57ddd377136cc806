"""ReplayBuffer.dumps / loads with every storage: exact continuation, and refusal of damaged or
mismatched checkpoints that leaves the buffer exactly as it was."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import (
    CheckpointError,
    ListStorage,
    RandomSampler,
    ReplayBuffer,
    RoundRobinWriter,
)
from tdreplay.core.checkpoint import MANIFEST_NAME, POINTER_NAME
from tdreplay.samplers import SamplerWithoutReplacement
from tdreplay.storages import (
    CompressedListStorage,
    FlatStorageCheckpointer,
    H5StorageCheckpointer,
    LazyMemmapStorage,
    LazyTensorStorage,
    NestedStorageCheckpointer,
)
from tdreplay.writers import TensorDictRoundRobinWriter

CAPACITY = 10

STORAGES = {
    "lazy_tensor": lambda tmp: LazyTensorStorage(CAPACITY),
    "memmap": lambda tmp: LazyMemmapStorage(CAPACITY, scratch_dir=tmp),
    "compressed": lambda tmp: CompressedListStorage(CAPACITY),
    "list": lambda tmp: ListStorage(CAPACITY),
    "flat": lambda tmp: LazyTensorStorage(CAPACITY, checkpointer=FlatStorageCheckpointer()),
    "nested": lambda tmp: LazyMemmapStorage(CAPACITY, scratch_dir=tmp,
                                            checkpointer=NestedStorageCheckpointer()),
    "h5": lambda tmp: LazyTensorStorage(CAPACITY, checkpointer=H5StorageCheckpointer()),
}


def rows(n: int, start: int = 0) -> TensorDict:
    i = torch.arange(start, start + n)
    return TensorDict({"obs": i.float().unsqueeze(-1).expand(n, 3).clone(),
                       ("next", "obs"): (i + 1).float().unsqueeze(-1).expand(n, 3).clone(),
                       ("next", "done"): (i % 4 == 3).unsqueeze(-1),
                       "i": i}, [n])


class Env:
    """Builds buffers of one storage kind, each with its own scratch directory."""

    def __init__(self, kind: str, tmp: Path) -> None:
        self.kind = kind
        self.tmp = tmp
        self.count = 0

    def buffer(self, seed: int = 0, sampler=None, writer=None, storage=None) -> ReplayBuffer:
        self.count += 1
        return ReplayBuffer(
            storage=(storage if storage is not None
                     else STORAGES[self.kind](self.tmp / f"scratch{self.count}")),
            sampler=sampler if sampler is not None else SamplerWithoutReplacement(),
            writer=writer if writer is not None else RoundRobinWriter(),
            batch_size=3,
            generator=torch.Generator().manual_seed(seed),
        )


@pytest.fixture(params=sorted(STORAGES))
def env(request, tmp_path):
    return Env(request.param, tmp_path)


def contents(rb: ReplayBuffer) -> list[int]:
    data = rb[:]
    return data["i"].tolist() if isinstance(data, TensorDict) else [d["i"].item() for d in data]


def snapshot(rb: ReplayBuffer) -> dict:
    return {
        "len": len(rb),
        "write_count": rb.write_count,
        "writer": copy.deepcopy(rb.writer.state_dict()),
        "contents": contents(rb),
        "obs": rb[:]["obs"].clone(),
        "sampler": copy.deepcopy(rb.sampler.state_dict()),
        "rng": rb._rng.get_state().clone(),
    }


def assert_unchanged(rb: ReplayBuffer, before: dict) -> None:
    after = snapshot(rb)
    assert after["len"] == before["len"]
    assert after["write_count"] == before["write_count"]
    assert after["writer"] == before["writer"]
    assert after["contents"] == before["contents"]
    assert torch.equal(after["obs"], before["obs"])
    assert after["sampler"].keys() == before["sampler"].keys()
    for key, value in before["sampler"].items():
        assert torch.equal(after["sampler"][key], value) if isinstance(value, torch.Tensor) \
            else after["sampler"][key] == value
    assert torch.equal(after["rng"], before["rng"])


def saved(env: Env, path: Path) -> ReplayBuffer:
    """A buffer that wrapped around and is half-way through a sampling epoch, saved at path."""
    rb = env.buffer(seed=1)
    rb.extend(rows(13))
    for _ in range(2):
        rb.sample()
    rb.dumps(path)
    return rb


def prefilled(env: Env) -> ReplayBuffer:
    rb = env.buffer(seed=2)
    rb.extend(rows(4, start=100))
    rb.sample()
    return rb


# ---- exact continuation -----------------------------------------------------------------------
def test_restored_buffer_continues_exactly(env, tmp_path):
    rb = saved(env, tmp_path / "ckpt")
    restored = env.buffer(seed=99)
    restored.loads(tmp_path / "ckpt")
    assert len(restored) == len(rb) == CAPACITY
    assert restored.write_count == 13 and restored.writer.cursor == 3
    assert contents(restored) == contents(rb) == [10, 11, 12, 3, 4, 5, 6, 7, 8, 9]
    # the rest of the epoch, and the epochs after it, are drawn identically
    for _ in range(8):
        a, info_a = rb.sample(return_info=True)
        b, info_b = restored.sample(return_info=True)
        assert torch.equal(info_a["index"], info_b["index"])
        assert torch.equal(a["i"] if isinstance(a, TensorDict) else a,
                           b["i"] if isinstance(b, TensorDict) else b)
    # and writing continues at the same cursor
    assert torch.equal(rb.extend(rows(4, 13)), restored.extend(rows(4, 13)))
    assert contents(restored) == contents(rb)
    assert restored.write_count == rb.write_count == 17


def test_remaining_epoch_is_kept(env, tmp_path):
    rb = env.buffer(seed=5)
    rb.extend(rows(9))
    first = rb.sample()  # 3 of 9 drawn
    rb.dumps(tmp_path / "ckpt")
    rest = [rb.sample(), rb.sample()]
    assert rb.sampler.ran_out
    restored = env.buffer(seed=6)
    restored.loads(tmp_path / "ckpt")
    again = [restored.sample(), restored.sample()]
    assert restored.sampler.ran_out

    def ids(batch):
        return batch["i"].tolist() if isinstance(batch, TensorDict) else [b["i"].item() for b in batch]

    assert [ids(b) for b in again] == [ids(b) for b in rest]
    assert sorted(ids(first) + sum((ids(b) for b in again), [])) == list(range(9))


def test_dumps_replaces_the_previous_checkpoint(env, tmp_path):
    rb = env.buffer()
    rb.extend(rows(3))
    rb.dumps(tmp_path / "ckpt")
    rb.extend(rows(2, 3))
    rb.dumps(tmp_path / "ckpt")
    snapshots = [p for p in (tmp_path / "ckpt").iterdir() if p.name.startswith("snapshot-")]
    assert len(snapshots) == 1
    restored = env.buffer()
    restored.loads(tmp_path / "ckpt")
    assert contents(restored) == [0, 1, 2, 3, 4]


# ---- damaged checkpoints -------------------------------------------------------------------------
def snapshot_files(path: Path) -> list[str]:
    pointer = json.loads((path / POINTER_NAME).read_text())
    snap = path / pointer["snapshot"]
    return sorted(p.relative_to(path).as_posix() for p in snap.rglob("*") if p.is_file())


def corrupt(path: Path, rel: str, how: str) -> None:
    file = path / rel
    data = file.read_bytes()
    if how == "truncate":
        file.write_bytes(data[: len(data) // 2])
    elif how == "flip":
        if not data:
            file.write_bytes(b"\x00")
            return
        pos = len(data) // 2
        file.write_bytes(data[:pos] + bytes([data[pos] ^ 0xFF]) + data[pos + 1:])
    elif how == "delete":
        file.unlink()
    elif how == "append":
        file.write_bytes(data + b"\x00")


@pytest.mark.parametrize("how", ["truncate", "flip", "delete", "append"])
def test_every_damaged_file_is_refused_and_the_buffer_is_unchanged(env, tmp_path, how):
    saved(env, tmp_path / "good")
    files = snapshot_files(tmp_path / "good")
    assert any("storage" in f for f in files) and any("sampler" in f for f in files)
    target = prefilled(env)
    before = snapshot(target)
    for rel in files:
        if how == "truncate" and (tmp_path / "good" / rel).stat().st_size == 0:
            continue
        damaged = tmp_path / f"damaged-{how}"
        shutil.rmtree(damaged, ignore_errors=True)
        shutil.copytree(tmp_path / "good", damaged)
        corrupt(damaged, rel, how)
        with pytest.raises(CheckpointError):
            target.loads(damaged)
        assert_unchanged(target, before)


def rewrite_json(file: Path, **changes) -> None:
    data = json.loads(file.read_text())
    data.update(changes)
    file.write_text(json.dumps(data))


@pytest.mark.parametrize("damage", ["pointer_version", "manifest_version", "pointer_garbage",
                                    "pointer_missing", "snapshot_missing", "manifest_missing",
                                    "path_missing"])
def test_damaged_pointer_or_manifest_is_refused(env, tmp_path, damage):
    path = tmp_path / "ckpt"
    saved(env, path)
    pointer = path / POINTER_NAME
    snap = path / json.loads(pointer.read_text())["snapshot"]
    match = None
    if damage == "pointer_version":
        rewrite_json(pointer, format_version=999)
        match = "format version 999"
    elif damage == "manifest_version":
        rewrite_json(snap / MANIFEST_NAME, format_version=0)
        match = "format version 0"
    elif damage == "pointer_garbage":
        pointer.write_text("{not json")
    elif damage == "pointer_missing":
        pointer.unlink()
        match = POINTER_NAME
    elif damage == "snapshot_missing":
        shutil.rmtree(snap)
    elif damage == "manifest_missing":
        (snap / MANIFEST_NAME).unlink()
        match = "incomplete"
    elif damage == "path_missing":
        path = tmp_path / "nowhere"
        match = "does not exist"
    target = prefilled(env)
    before = snapshot(target)
    with pytest.raises(CheckpointError, match=match):
        target.loads(path)
    assert_unchanged(target, before)


def test_half_written_snapshot_beside_a_good_one_is_ignored(env, tmp_path):
    path = tmp_path / "ckpt"
    rb = saved(env, path)
    half = path / "snapshot-999999-deadbeef"
    shutil.copytree(path / json.loads((path / POINTER_NAME).read_text())["snapshot"], half)
    (half / MANIFEST_NAME).unlink()
    files = sorted(p.relative_to(half) for p in half.rglob("*"))
    restored = env.buffer()
    restored.loads(path)
    assert contents(restored) == contents(rb)
    # a folder the format did not record (here: named like a snapshot by someone else) is not
    # the format's to remove: the next save keeps it, and the checkpoint still loads
    rb.dumps(path)
    assert sorted(p.relative_to(half) for p in half.rglob("*")) == files
    assert half.name not in json.loads((path / POINTER_NAME).read_text())["snapshots"]
    restored = env.buffer()
    restored.loads(path)
    assert contents(restored) == contents(rb)


# ---- mismatched checkpoints -------------------------------------------------------------------
def test_mismatched_components_are_refused(env, tmp_path):
    path = tmp_path / "ckpt"
    saved(env, path)
    other_storage = "memmap" if env.kind != "memmap" else "lazy_tensor"
    candidates = {
        "sampler": env.buffer(sampler=RandomSampler()),
        "writer": env.buffer(writer=TensorDictRoundRobinWriter()),
        "storage": env.buffer(storage=STORAGES[other_storage](tmp_path / "other")),
    }
    for name, target in candidates.items():
        if name == "writer":
            # TensorDictRoundRobinWriter stores an "index" entry, so a written storage would
            # disagree too; left empty, the writer is what the checkpoint disagrees with
            with pytest.raises(CheckpointError, match=name):
                target.loads(path)
            assert len(target) == 0 and target.write_count == 0
            continue
        target.extend(rows(2, 50))
        before = snapshot(target)
        with pytest.raises(CheckpointError, match=name):
            target.loads(path)
        assert_unchanged(target, before)


@pytest.mark.parametrize("kind", ["lazy_tensor", "memmap", "flat", "nested", "h5"])
def test_mismatched_shapes_and_sizes_are_refused(tmp_path, kind):
    env = Env(kind, tmp_path)
    path = tmp_path / "ckpt"
    saved(env, path)
    wider = env.buffer()
    wider.extend(TensorDict({"obs": torch.zeros(2, 4), ("next", "obs"): torch.zeros(2, 4),
                             ("next", "done"): torch.zeros(2, 1, dtype=torch.bool),
                             "i": torch.arange(2)}, [2]))
    other_dtype = env.buffer()
    other_dtype.extend(rows(2).apply(lambda x: x.double() if x.is_floating_point() else x))
    factory = STORAGES[kind]
    bigger = env.buffer(storage=_resized(factory(tmp_path / "big"), CAPACITY + 1))
    for target in (wider, other_dtype, bigger):
        before = snapshot(target) if len(target) else None
        with pytest.raises(CheckpointError):
            target.loads(path)
        if before is not None:
            assert_unchanged(target, before)
        else:
            assert len(target) == 0 and target.write_count == 0


def _resized(storage, max_size: int):
    """The same kind of storage with another max_size."""
    if isinstance(storage, LazyMemmapStorage):
        return LazyMemmapStorage(max_size, scratch_dir=storage.scratch_dir.parent / "resized",
                                 checkpointer=storage.checkpointer)
    return LazyTensorStorage(max_size, checkpointer=storage.checkpointer)


# ---- a storage saved alone (storage.dumps / storage.loads, no buffer) ------------------------
def storage_contents(storage) -> list[int]:
    n = len(storage)
    data = storage.get(torch.arange(n))
    return data["i"].tolist() if isinstance(data, TensorDict) else [d["i"].item() for d in data]


def filled_storage(kind: str, tmp: Path, start: int, n: int = 4):
    storage = STORAGES[kind](tmp)
    data = rows(n, start=start)
    storage.set(torch.arange(n), data if kind != "list" else list(data.unbind(0)))
    return storage


@pytest.mark.parametrize("kind", sorted(STORAGES))
def test_a_storage_save_failing_midway_keeps_the_previous_checkpoint(tmp_path, kind,
                                                                     monkeypatch):
    import errno

    import tdreplay.core.checkpoint as checkpoint

    path = tmp_path / "ckpt"
    filled_storage(kind, tmp_path / "s1", start=10).dumps(path)
    newer = filled_storage(kind, tmp_path / "s2", start=20)
    real = checkpoint._fsync_path

    def full_disk(target):  # every file of the new snapshot is written, then the disk is full
        if checkpoint.MANIFEST_NAME not in str(target) and "snapshot-" in str(target):
            raise OSError(errno.ENOSPC, "No space left on device", str(target))
        return real(target)

    monkeypatch.setattr(checkpoint, "_fsync_path", full_disk)
    with pytest.raises(OSError):
        newer.dumps(path)
    monkeypatch.undo()
    restored = STORAGES[kind](tmp_path / "s3")
    restored.loads(path)
    assert storage_contents(restored) == [10, 11, 12, 13]


def test_a_flat_storage_save_failing_on_its_second_array_file_keeps_the_previous(
        tmp_path, monkeypatch):
    # (the tester's repro: the new obs file replaced, the old ones kept, loaded without error)
    import errno

    import tdreplay.storages.checkpointers as checkpointers

    path = tmp_path / "ckpt"
    old = filled_storage("flat", tmp_path, start=10)
    old.dumps(path)
    newer = filled_storage("flat", tmp_path, start=20)
    real, calls = checkpointers.write_array_file, []

    def failing(file, array):
        calls.append(file)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(file))
        return real(file, array)

    monkeypatch.setattr(checkpointers, "write_array_file", failing)
    with pytest.raises(OSError, match="No space left"):
        newer.dumps(path)
    monkeypatch.undo()
    restored = STORAGES["flat"](tmp_path)
    restored.loads(path)
    assert len(calls) == 2 and len(restored) == 4
    assert (restored.get(torch.arange(4)) == old.get(torch.arange(4))).all()  # every entry


DATA_FILES = {"lazy_tensor": "data/i.memmap", "memmap": "data/i.memmap", "flat": "i.bin",
              "nested": "data/i.memmap", "h5": "checkpoint.h5", "compressed": "blobs.bin",
              "list": "items.pt"}


@pytest.mark.parametrize("kind", sorted(STORAGES))
def test_a_damaged_data_file_of_a_storage_checkpoint_is_refused_by_name(tmp_path, kind):
    path = tmp_path / "ckpt"
    filled_storage(kind, tmp_path / "s1", start=10).dumps(path)
    snap = path / json.loads((path / POINTER_NAME).read_text())["snapshot"]
    corrupt(snap, DATA_FILES[kind], "flip")
    target = filled_storage(kind, tmp_path / "s2", start=50, n=2)
    with pytest.raises(CheckpointError, match=f"{DATA_FILES[kind]}' is corrupted"):
        target.loads(path)
    assert storage_contents(target) == [50, 51]


def test_a_damaged_blob_of_a_plainly_written_compressed_checkpoint_is_refused(tmp_path):
    # files written without a manifest (a checkpoint of an earlier version, or the
    # checkpointer's own dumps): the CRC-32 of every row's bytes is checked when loading
    saved = filled_storage("compressed", tmp_path, start=10)
    saved.checkpointer.dumps(saved, tmp_path)
    corrupt(tmp_path, "blobs.bin", "flip")
    target = filled_storage("compressed", tmp_path, start=50, n=2)
    with pytest.raises(CheckpointError, match=r"blobs\.bin': row 1: its compressed bytes are damaged"):
        target.loads(tmp_path)
    assert storage_contents(target) == [50, 51]


@pytest.mark.parametrize("kind", sorted(STORAGES))
def test_a_storage_checkpoint_written_plainly_still_loads_and_is_replaced(tmp_path, kind):
    old = filled_storage(kind, tmp_path / "s1", start=10)
    old.write_files(tmp_path / "ckpt")  # the layout of earlier versions: files in the path
    restored = STORAGES[kind](tmp_path / "s2")
    restored.loads(tmp_path / "ckpt")
    assert storage_contents(restored) == [10, 11, 12, 13]
    filled_storage(kind, tmp_path / "s3", start=20).dumps(tmp_path / "ckpt")
    newest = STORAGES[kind](tmp_path / "s4")
    newest.loads(tmp_path / "ckpt")
    assert storage_contents(newest) == [20, 21, 22, 23]


def test_a_storage_saved_by_a_buffer_writes_into_the_buffer_snapshot(tmp_path):
    rb = ReplayBuffer(storage=LazyTensorStorage(CAPACITY))
    rb.extend(rows(3))
    rb.dumps(tmp_path)
    snap = tmp_path / json.loads((tmp_path / POINTER_NAME).read_text())["snapshot"]
    assert (snap / "storage" / "storage.json").is_file()
    assert not list(snap.rglob(POINTER_NAME)) and not list(snap.rglob("snapshot-*"))


@pytest.mark.parametrize(("saver", "loader"), [
    ("list", "compressed"), ("list", "lazy_tensor"), ("compressed", "list"),
    ("lazy_tensor", "list"), ("compressed", "lazy_tensor")])
def test_a_checkpoint_of_another_storage_class_names_it(tmp_path, saver, loader):
    saved = filled_storage(saver, tmp_path / "s1", start=10)
    saved.dumps(tmp_path / "ckpt")
    target = STORAGES[loader](tmp_path / "s2")
    name = type(saved).__name__
    with pytest.raises(CheckpointError, match=f"written by a {name}; load it into a {name}"):
        target.loads(tmp_path / "ckpt")
    assert len(target) == 0
