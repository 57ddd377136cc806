"""A checkpoint directory owns exactly what it writes; saves to one path take turns; a state of
another buffer (capacity, cursor) is refused; indices and counts get clear messages."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from tdreplay.core import (
    CheckpointError,
    ListStorage,
    ReplayBuffer,
    RoundRobinWriter,
    TensorDictReplayBuffer,
)
from tdreplay.core.checkpoint import (
    LOCK_NAME,
    POINTER_NAME,
    open_checkpoint,
    verify_checkpoint,
    write_checkpoint,
)
from tdreplay.core.utils import as_long_tensor, check_batch_size


def make(max_size: int = 8, seed: int = 0) -> ReplayBuffer:
    return ReplayBuffer(storage=ListStorage(max_size), batch_size=4,
                        generator=torch.Generator().manual_seed(seed))


def filled(values: range, max_size: int = 8) -> ReplayBuffer:
    rb = make(max_size)
    rb.extend([torch.tensor(float(v)) for v in values])
    return rb


def contents(rb: ReplayBuffer) -> list[float]:
    return [float(x) for x in rb.storage.items()]


def pointer(path: Path) -> dict:
    return json.loads((path / POINTER_NAME).read_text())


# ---- item 1: the format removes only the snapshots it recorded ---------------------------------
def test_entries_named_like_snapshots_survive_dumps(tmp_path, same):
    user_dir = tmp_path / "snapshot-000000-abcdef12"
    user_dir.mkdir()
    (user_dir / "notes.txt").write_text("mine")
    (tmp_path / "snapshot-000001-deadbeef").write_text("a file of mine")
    (tmp_path / "snapshot-notes").mkdir()
    (tmp_path / f".{POINTER_NAME}.1234abcd.tmp").write_text("looks like an old temporary")
    theirs = {p.name for p in tmp_path.iterdir()}

    rb = filled(range(5))
    for extra in range(3):  # several saves: each removes the previous snapshot, only that
        rb.extend([torch.tensor(100.0 + extra)])
        rb.dumps(tmp_path)
    assert (user_dir / "notes.txt").read_text() == "mine"
    assert (tmp_path / "snapshot-000001-deadbeef").read_text() == "a file of mine"
    ours = {p.name for p in tmp_path.iterdir()} - theirs
    current = pointer(tmp_path)["snapshot"]
    assert ours == {POINTER_NAME, LOCK_NAME, current}
    assert pointer(tmp_path)["snapshots"] == [current]
    assert current not in theirs

    restored = make()
    restored.loads(tmp_path)
    same(restored.storage.items(), rb.storage.items())
    assert restored.write_count == 8 and restored.writer.cursor == 0


def test_a_failed_save_removes_its_snapshot_and_keeps_the_previous_one(tmp_path):
    rb = filled(range(3))
    rb.dumps(tmp_path)
    before = pointer(tmp_path)
    entries = {p.name for p in tmp_path.iterdir()}

    class Boom(Exception):
        pass

    with pytest.raises(Boom), write_checkpoint(tmp_path) as snap:
        (snap / "half.bin").write_bytes(b"x" * 10)
        raise Boom
    assert not snap.exists()
    assert {p.name for p in tmp_path.iterdir()} == entries
    assert pointer(tmp_path)["snapshot"] == before["snapshot"]
    assert pointer(tmp_path)["snapshots"] == before["snapshots"]
    restored = make()
    restored.loads(tmp_path)
    assert contents(restored) == [0.0, 1.0, 2.0]


def test_a_failure_after_the_commit_keeps_the_new_checkpoint_and_the_old_one(
        tmp_path, monkeypatch):
    # the commit's rename went through, then the fsync of the directory fails (a full disk,
    # an I/O error): the pointer already names the new snapshot, which must not be removed,
    # and the previous snapshot stays too (the rename may not last a power loss)
    import tdreplay.core.checkpoint as checkpoint
    rb = filled(range(3))
    rb.dumps(tmp_path)
    old_snapshot = pointer(tmp_path)["snapshot"]
    rb.extend([torch.tensor(7.0)])
    fsync_path = checkpoint._fsync_path

    def fsync_failing_after_the_commit(path):
        if Path(path) == tmp_path and pointer(tmp_path)["snapshot"] != old_snapshot:
            raise OSError(28, "No space left on device")
        fsync_path(path)

    monkeypatch.setattr(checkpoint, "_fsync_path", fsync_failing_after_the_commit)
    with pytest.raises(OSError, match="No space"):
        rb.dumps(tmp_path)
    monkeypatch.setattr(checkpoint, "_fsync_path", fsync_path)
    new_snapshot = pointer(tmp_path)["snapshot"]
    assert new_snapshot != old_snapshot
    assert (tmp_path / new_snapshot).is_dir() and (tmp_path / old_snapshot).is_dir()
    restored = make()
    restored.loads(tmp_path)
    assert contents(restored) == [0.0, 1.0, 2.0, 7.0]
    rb.dumps(tmp_path)  # the next save works and keeps only its own snapshot
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("snapshot-")] == \
        [pointer(tmp_path)["snapshot"]]


def test_snapshots_of_interrupted_saves_are_recorded_then_removed(tmp_path):
    rb = filled(range(3))
    rb.dumps(tmp_path)
    # what a save killed after recording its snapshot leaves: the pointer names it as ours
    with pytest.raises(KeyboardInterrupt), write_checkpoint(tmp_path) as snap:
        recorded = pointer(tmp_path)["snapshots"]
        assert snap.name in recorded and pointer(tmp_path)["snapshot"] != snap.name
        raise KeyboardInterrupt
    rb.extend([torch.tensor(7.0)])
    rb.dumps(tmp_path)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("snapshot-")] == \
        [pointer(tmp_path)["snapshot"]]


def test_an_unreadable_pointer_owns_nothing(tmp_path):
    """A damaged pointer cannot prove which snapshots are the format's: nothing is removed."""
    rb = filled(range(3))
    rb.dumps(tmp_path)
    old = pointer(tmp_path)["snapshot"]
    (tmp_path / POINTER_NAME).write_text("{not json")
    with pytest.raises(CheckpointError, match=POINTER_NAME):
        make().loads(tmp_path)
    rb.extend([torch.tensor(9.0)])
    rb.dumps(tmp_path)  # commits a new checkpoint beside the old snapshot, which stays
    assert (tmp_path / old).is_dir()
    restored = make()
    restored.loads(tmp_path)
    assert contents(restored) == [0.0, 1.0, 2.0, 9.0]


def test_pointer_without_the_new_keys_still_loads_and_is_replaced(tmp_path):
    """Checkpoints written before the pointer recorded its snapshots load as before."""
    rb = filled(range(4))
    rb.dumps(tmp_path)
    current = pointer(tmp_path)["snapshot"]
    (tmp_path / POINTER_NAME).write_text(json.dumps({"format_version": 1, "snapshot": current}))
    restored = make()
    restored.loads(tmp_path)
    assert contents(restored) == [0.0, 1.0, 2.0, 3.0]
    restored.dumps(tmp_path)  # the old snapshot was the pointer's: it is removed
    assert not (tmp_path / current).exists()
    assert pointer(tmp_path)["snapshots"] == [pointer(tmp_path)["snapshot"]]


@pytest.mark.parametrize("bad", ["../elsewhere", "/etc", "notes", "snapshot-1-xyz/../.."])
def test_pointer_naming_something_else_is_refused(tmp_path, bad):
    filled(range(2)).dumps(tmp_path)
    (tmp_path / POINTER_NAME).write_text(json.dumps({"format_version": 1, "snapshot": bad}))
    with pytest.raises(CheckpointError, match="not a snapshot directory"):
        verify_checkpoint(tmp_path)


# ---- item 2: saves to one path take turns ------------------------------------------------------
def test_threads_saving_to_one_path_leave_one_of_their_checkpoints(tmp_path):
    path = tmp_path / "ckpt"
    buffers = [filled(range(10 * k, 10 * k + 3 + k)) for k in range(4)]
    errors: list[BaseException] = []

    def save(rb: ReplayBuffer) -> None:
        try:
            for _ in range(6):
                rb.dumps(path)
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=save, args=(rb,)) for rb in buffers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    restored = make()
    restored.loads(path)
    assert contents(restored) in [contents(rb) for rb in buffers]
    assert [p.name for p in path.iterdir() if p.name.startswith("snapshot-")] == \
        [pointer(path)["snapshot"]]


def test_a_save_waits_for_a_reader(tmp_path):
    filled(range(3)).dumps(tmp_path)
    other = filled(range(20, 25))
    done = threading.Event()

    def save() -> None:
        other.dumps(tmp_path)
        done.set()

    with open_checkpoint(tmp_path) as snap:
        writer = threading.Thread(target=save)
        writer.start()
        writer.join(timeout=0.5)
        assert not done.is_set()  # blocked on the reader's lock
        assert (snap / "buffer.json").is_file()  # the snapshot being read is still there
    writer.join()
    assert done.is_set()
    restored = make()
    restored.loads(tmp_path)
    assert contents(restored) == [20.0, 21.0, 22.0, 23.0, 24.0]


# ---- item 5: states of another buffer are refused ------------------------------------------------
def test_state_of_another_capacity_is_refused(unchanged):
    rb = filled(range(3))
    for other in (filled(range(6), max_size=4), filled(range(3), max_size=16)):
        with unchanged(rb), pytest.raises(ValueError, match=r"_storage.*max_size"):
            rb.load_state_dict(other.state_dict())
    # and through a checkpoint
    assert contents(rb) == [0.0, 1.0, 2.0]


@pytest.mark.parametrize("cursor", [999, 8, -5, "3", 2.0, True])
def test_writer_cursor_out_of_range_is_refused(cursor, unchanged):
    rb = filled(range(3))
    state = filled(range(10)).state_dict()
    state["_writer"] = {**state["_writer"], "cursor": cursor}
    with unchanged(rb), pytest.raises(ValueError, match=r"_writer.*cursor"):
        rb.load_state_dict(state)


@pytest.mark.parametrize("write_count", [-1, 1.5, None])
def test_negative_or_non_int_write_count_is_refused(write_count, unchanged):
    rb = filled(range(3))
    state = filled(range(5)).state_dict()
    state["_writer"] = {**state["_writer"], "write_count": write_count}
    with unchanged(rb), pytest.raises(ValueError, match=r"_writer.*write_count"):
        rb.load_state_dict(state)


def test_too_many_items_without_max_size_is_refused(unchanged):
    rb = filled(range(3))
    state = filled(range(5)).state_dict()
    state["_storage"] = {"storage": [torch.tensor(1.0)] * 9}  # an older state: no max_size
    with unchanged(rb), pytest.raises(ValueError, match=r"_storage.*9 items.*max_size=8"):
        rb.load_state_dict(state)


def test_foreign_generator_state_is_refused(unchanged):
    rb = filled(range(3))
    state = filled(range(5)).state_dict()
    state["_rng"] = torch.zeros(3, dtype=torch.uint8)
    with unchanged(rb), pytest.raises(ValueError, match="_rng"):
        rb.load_state_dict(state)


def test_accepted_state_continues_where_it_was(same):
    src = filled(range(11))  # wrapped: cursor 3
    rb = filled(range(2))
    rb.load_state_dict(src.state_dict())
    assert rb.writer.cursor == 3 and rb.write_count == 11
    rb.extend([torch.tensor(50.0)])
    src.extend([torch.tensor(50.0)])
    same(rb.storage.items(), src.storage.items())


def test_writer_checks_cursor_against_its_storage():
    w = RoundRobinWriter()
    w.check_state_dict({"cursor": 999, "write_count": 0})  # no storage yet: only the sign
    w.register_storage(ListStorage(4))
    w.check_state_dict({"cursor": 3, "write_count": 0})
    with pytest.raises(ValueError, match=r"state_dict\['cursor'\] is 4, outside \[0, 4\)"):
        w.check_state_dict({"cursor": 4, "write_count": 0})
    with pytest.raises(ValueError, match=r"'cursor'\] is -5"):
        w.load_state_dict({"cursor": -5, "write_count": 0})
    assert w.state_dict() == {"cursor": 0, "write_count": 0}


def test_checkpoint_with_a_consistent_manifest_but_a_bad_cursor_is_refused(tmp_path, unchanged):
    """Damage the manifest would not see (a checkpoint rewritten by hand, checksums redone)
    is still refused by the component's own checks."""
    src = filled(range(5))
    src.writer.cursor = 999  # what a tool editing the state file could leave
    src.dumps(tmp_path)
    rb = filled(range(3))
    with unchanged(rb), pytest.raises(CheckpointError, match=r"cursor.*999.*state\.pt"):
        rb.loads(tmp_path)


# ---- messages ----------------------------------------------------------------------------------
@pytest.mark.parametrize("index", [2**64, -(2**63) - 1, [0, 2**64],
                                   np.array([2**63], dtype=np.uint64),
                                   torch.tensor([2**63 + 1], dtype=torch.uint64)])
def test_index_beyond_int64_names_the_index(index):
    with pytest.raises(IndexError, match=r"index .*(does not fit in int64|out of range)"):
        filled(range(3))[index]
    with pytest.raises(IndexError, match="^index holds .* does not fit in int64"):
        as_long_tensor(index if not isinstance(index, int) else [index], name="index")


def test_uint64_within_range_converts():
    assert as_long_tensor(torch.tensor([5, 0], dtype=torch.uint64)).tolist() == [5, 0]
    assert as_long_tensor(np.array([7], dtype=np.uint64)).tolist() == [7]


def test_numpy_integers_count_like_ints():
    rb = ReplayBuffer(storage=ListStorage(np.int64(8)), batch_size=np.int32(3),
                      prefetch=np.int64(0))
    rb.extend([torch.tensor(float(i)) for i in range(5)])
    assert rb.batch_size == 3 and type(rb.batch_size) is int
    assert rb.sample(np.int64(4)).shape == (4,)
    assert rb.sample().shape == (3,)
    out = check_batch_size(np.uint8(2))
    assert out == 2 and type(out) is int
    for bad in (True, np.bool_(True)):
        with pytest.raises(TypeError, match="batch_size"):
            rb.sample(bad)
        with pytest.raises(ValueError, match="batch_size"):
            check_batch_size(bad)
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        rb.sample(np.int64(0))


def test_tensordict_buffer_checkpoint_records_max_size(tmp_path):
    from tensordict import TensorDict

    rb = TensorDictReplayBuffer(storage=ListStorage(5), batch_size=2)
    rb.extend(TensorDict({"obs": torch.arange(3.0)}, [3]))
    assert rb.state_dict()["_storage"]["max_size"] == 5
    other = TensorDictReplayBuffer(storage=ListStorage(6), batch_size=2)
    rb.dumps(tmp_path)
    with pytest.raises(CheckpointError, match="max_size=5"):
        other.loads(tmp_path)
    assert len(other) == 0


def test_a_save_to_the_path_of_a_file_says_so_and_leaves_it(tmp_path):
    target = tmp_path / "notes.txt"
    target.write_text("mine")
    with pytest.raises(FileExistsError, match="is a file: a checkpoint is a directory"):
        filled(range(2)).dumps(target)
    assert target.read_text() == "mine"
