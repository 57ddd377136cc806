"""An in-place edit of a LazyMemmapStorage's counted rows (``set_key``, ``update_``,
``storage[tuple] = ...`` and the buffer edits made of them) whose process is killed half-way
leaves no row half edited: whoever takes the lock next writes the old values back (an undo
journal), so every row reads as it was, none is dropped, and the ring goes on. A load killed
half-way leaves the rows it was replacing as they were (journaled too: see
test_memmap_load_killed.py); an edit that raises half-way, or does not fit, leaves the rows as
they were."""

from __future__ import annotations

import shutil

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ReplayBuffer, RoundRobinWriter, TensorDictReplayBuffer, testing
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage
from tdreplay.storages._edit_journal import UNDO_FILE

CAP = 10
#: the ids of a full ring written with ids 0..12 (cursor at 3), row by row
OLD = [10, 11, 12, 3, 4, 5, 6, 7, 8, 9]
KEYS = ["a", "b", "id", ("next", "z")]


rows = testing.id_rows  # rows whose every entry follows from their id
read_ids = testing.read_id_rows  # their ids, checked whole


def full_ring(path) -> TensorDictReplayBuffer:
    rb = TensorDictReplayBuffer(storage=LazyMemmapStorage(CAP, scratch_dir=path),
                                writer=RoundRobinWriter(track_generations=True), batch_size=64,
                                generator=torch.Generator().manual_seed(0))
    rb.extend(rows(range(13)))
    assert read_ids(rb.storage) == OLD
    return rb


def entries(storage) -> list[torch.Tensor]:
    """The storage's tensors (whose memory the killed edits write)."""
    written = storage.written_rows()
    return [written.get(key) for key in KEYS]


def new(key, n: int) -> torch.Tensor:
    return {"a": torch.full((n, 3), 1000.0, dtype=torch.float64),
            "b": torch.full((n,), 1000.0), ("next", "z"): torch.full((n,), 1000)}[key]


#: (the edit, the storage write it dies in: its first half of rows written)
EDITS = {
    "set_": (lambda rb: rb.set_("a", new("a", CAP)), 1),
    "set_at_": (lambda rb: rb.set_at_("b", new("b", 4), torch.tensor([7, 2, 5, 0])), 1),
    "storage.set_key": (lambda rb: rb.storage.set_key(("next", "z"), new(("next", "z"), 7),
                                                       slice(2, 9)), 1),
    "update_": (lambda rb: rb.update_({key: new(key, CAP) for key in ("a", "b")}), 1),
    "update_, second entry": (
        lambda rb: rb.update_(TensorDict({"a": new("a", CAP), "next": {"z": new(
            ("next", "z"), CAP)}}, [CAP])), 2),
    "rb[tuple] =": (lambda rb: rb.__setitem__(
        (torch.tensor([1, 4, 6]),), TensorDict({"a": new("a", 3), "b": new("b", 3)}, [3])), 2),
    "update_if_present": (
        lambda rb: rb.update_if_present(
            index=torch.tensor([2, 5, 8]), generation=rb.writer.generations_of(
                torch.tensor([2, 5, 8])), patch={"a": new("a", 3), "b": new("b", 3)}), 1),
    "update_if_present, second entry": (
        lambda rb: rb.update_if_present(
            index=torch.tensor([8, 2]), generation=rb.writer.generations_of(
                torch.tensor([8, 2])), patch={"a": new("a", 2), "b": new("b", 2)}), 2),
}


def edit_and_die(killed, rb, how: str) -> None:
    edit, write = EDITS[how]
    killed.die_in_tensor_write(entries(rb.storage), after=write)
    edit(rb)


def die_between_entries(killed, rb) -> None:
    """``update_if_present`` writes its patch entry by entry (a ``set_key`` each): die once the
    first entry is written whole, before the second is begun."""
    storage = rb.storage
    real = storage.set_key

    def set_key(*args, **kwargs):
        real(*args, **kwargs)
        killed.die()

    storage.set_key = set_key
    rb.update_if_present(index=torch.tensor([0, 9, 4]),
                         generation=rb.writer.generations_of(torch.tensor([0, 9, 4])),
                         patch={"a": new("a", 3), "b": new("b", 3)})


def assert_as_before(path) -> None:
    """Another process's storage on the same files: every row as it was, the count and the
    cursor too, no record nor journal left; later writes go on from the cursor."""
    storage = LazyMemmapStorage(CAP, scratch_dir=path, existsok=True)
    assert read_ids(storage) == OLD
    assert len(storage) == CAP and int(storage.shared_writer_counters()[0]) == 3
    assert not storage._torn.pending and not (path / UNDO_FILE).exists()
    rb = ReplayBuffer(storage=storage)
    rb.extend(rows([100, 101]))  # rows 3 and 4: the oldest ids (3, 4) go
    assert read_ids(storage) == [10, 11, 12, 100, 101, 5, 6, 7, 8, 9]
    assert int(storage.shared_writer_counters()[0]) == 5


@pytest.mark.parametrize("how", sorted(EDITS))
def test_killed_edit_leaves_every_row_as_it_was(tmp_path, killed, how):
    rb = full_ring(tmp_path / "s")
    killed.run_killed(edit_and_die, killed, rb, how)
    assert_as_before(tmp_path / "s")


def test_edits_of_one_lock_hold_are_undone_together(tmp_path, killed):
    rb = full_ring(tmp_path / "s")
    killed.run_killed(die_between_entries, killed, rb)
    assert_as_before(tmp_path / "s")


@pytest.mark.parametrize("first", ["sample", "len", "get_trusted"])
def test_a_live_reader_reads_the_old_rows(tmp_path, killed, first):
    rb = full_ring(tmp_path / "s")  # mapped before the editor dies
    killed.run_killed(edit_and_die, killed, rb, "update_, second entry")
    if first == "sample":
        batch = rb.sample()
        assert set(batch["id"].tolist()) <= set(OLD)
        assert bool((batch["a"] == batch["id"].double().unsqueeze(-1)).all())
        assert bool((batch["next", "z"] == batch["id"] * 10).all())
    elif first == "len":
        assert len(rb) == CAP
    else:
        got = rb.storage.get_trusted(torch.arange(CAP))
        assert got["a"][:, 0].tolist() == [float(i) for i in OLD]
    assert read_ids(rb.storage) == OLD
    assert_as_before(tmp_path / "s")


def restorer_dies(killed, path, after: int) -> None:
    """Open the storage (which writes the old values back), dying in the ``after``-th write of
    the restore, half done."""
    killed.die_in_tensor_write(None, after=after)
    LazyMemmapStorage(CAP, scratch_dir=path, existsok=True)


def test_a_killed_restore_is_done_again(tmp_path, killed):
    template = tmp_path / "template"
    rb = full_ring(template)
    killed.run_killed(edit_and_die, killed, rb, "update_, second entry")
    for after in range(1, 20):
        path = tmp_path / f"kill{after}"
        shutil.copytree(template, path)
        code = killed.run(restorer_dies, killed, path, after)
        assert_as_before(path)
        if code == 0:  # this one finished: every earlier one was killed
            assert after > 2
            break
    else:
        pytest.fail("the restore never finished")


def load_and_die(killed, path) -> None:
    storage = LazyMemmapStorage(CAP, scratch_dir=path, existsok=True)
    loaded = LazyTensorStorage(CAP)
    loaded.set(slice(0, 5), rows(range(100, 105)))
    killed.die_after_first_leaf()
    storage.load_state_dict(loaded.state_dict())


def test_killed_load_leaves_the_rows_it_was_replacing(tmp_path, killed):
    path = tmp_path / "s"
    rb = ReplayBuffer(storage=LazyMemmapStorage(CAP, scratch_dir=path))
    rb.extend(rows(range(8)))
    killed.run_killed(load_and_die, killed, path)
    storage = LazyMemmapStorage(CAP, scratch_dir=path, existsok=True)
    assert read_ids(storage) == list(range(8))  # the load never happened: nothing dropped
    rb = ReplayBuffer(storage=storage)
    rb.extend(rows([200, 201]))
    assert read_ids(storage) == [*range(8), 200, 201]


def test_an_edit_interrupted_in_process_writes_its_old_values_back(tmp_path, monkeypatch):
    rb = full_ring(tmp_path / "s")
    memory = {t.untyped_storage().data_ptr() for t in entries(rb.storage)}
    real_copy = torch.Tensor.copy_
    writes = []

    def copy_(dest, src, *args, **kwargs):
        out = real_copy(dest, src, *args, **kwargs)
        if dest.untyped_storage().data_ptr() in memory:
            writes.append(1)
            if len(writes) == 2:
                raise KeyboardInterrupt  # the second entry written, the third not
        return out

    monkeypatch.setattr(torch.Tensor, "copy_", copy_)
    with pytest.raises(KeyboardInterrupt):
        rb.update_({key: new(key, CAP) for key in ("a", "b", ("next", "z"))})
    monkeypatch.undo()
    assert read_ids(rb.storage) == OLD
    assert not rb.storage._torn.pending
    rb.set_at_("b", torch.tensor(-3.5), 0)  # later edits go on
    assert rb.storage[0]["b"].item() == -3.5


@pytest.mark.parametrize("kind", ["memmap", "tensor"])
def test_a_tuple_assignment_that_does_not_fit_writes_nothing(tmp_path, kind):
    storage = (LazyMemmapStorage(CAP, scratch_dir=tmp_path / "s") if kind == "memmap"
               else LazyTensorStorage(CAP))
    storage.set(slice(0, CAP), rows(range(CAP)))
    bad = TensorDict({"a": new("a", 2), "b": torch.zeros(2, 2)}, [2])  # "b" holds scalars
    with pytest.raises((ValueError, RuntimeError)) as err:
        storage[(torch.tensor([1, 3]),)] = bad
    assert read_ids(storage) == list(range(CAP))  # "a" not written either
    assert err.type is ValueError and "'b'" in str(err.value)  # named, before any write
