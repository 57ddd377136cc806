"""A load into a LazyMemmapStorage shared by processes (``rb.loads``, ``storage.loads``,
``load_state_dict``) whose process is killed (SIGKILL) at any point of installing the rows
leaves the storage exactly as it was before the load: every row, the row count, the writer's
cursor and write count (what ``len``, ``rb[:]``, sampling and the next ``extend`` see), in the
processes that had it mapped and in a fresh one. Never rows dropped, never old and loaded rows
mixed. The old values are journaled before the load writes anything (``_shared_edits``,
``_torn_writes``); a load that completes leaves the checkpoint, and no record."""

from __future__ import annotations

import pytest
import torch

from tdreplay.core import ReplayBuffer, RoundRobinWriter, testing
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage
from tdreplay.storages._edit_journal import UNDO_FILE
from tdreplay.storages._layout import TensorLayout

CAP = 10
#: the buffers killed loads go into: (ids written, in order; ids of rows 0.., cursor)
OLD = {
    "partial": (list(range(8)), list(range(8)), 8),  # 8 rows of 10: shorter than capacity
    "ring": (list(range(13)), [10, 11, 12, 3, 4, 5, 6, 7, 8, 9], 3),  # full, wrapped
}
#: checkpoint lengths: shorter than, as long as and longer than the partial buffer (the ring
#: holds 10: the capacity bounds a checkpoint)
LOADED = (5, 8, 10)


rows = testing.id_rows  # rows whose every entry follows from their id
read_ids = testing.read_id_rows  # their ids, checked whole


def buffer(path, **kwargs) -> ReplayBuffer:
    return ReplayBuffer(storage=LazyMemmapStorage(CAP, scratch_dir=path, **kwargs),
                        writer=RoundRobinWriter(), batch_size=32,
                        generator=torch.Generator().manual_seed(0))


def checkpoint(tmp_path, n: int):
    """A checkpoint of a buffer of the same kind holding ids 100, 101, ... (``n`` rows), and
    beside it (``.storage``) one of its storage alone."""
    src = buffer(tmp_path / f"src{n}")
    src.extend(rows(range(100, 100 + n)))
    src.dumps(tmp_path / f"ck{n}")
    src.storage.dumps(tmp_path / f"ck{n}.storage")
    return tmp_path / f"ck{n}"


def shared(tmp_path, old: str) -> ReplayBuffer:
    rb = buffer(tmp_path / "s")
    written, _, _ = OLD[old]
    for i in range(0, len(written), 4):  # several extends (the writer's counters move)
        rb.extend(rows(written[i:i + 4]))
    assert read_ids(rb.storage) == OLD[old][1]
    return rb


# ---- where the loader dies (patched in the killed child) -------------------------------------
def die_before_first_row(killed, rb) -> None:
    def copy_rows(layout, *args, **kwargs):
        killed.die()

    TensorLayout.copy_rows = copy_rows  # type: ignore[method-assign]


def die_mid_copy(killed, rb) -> None:
    """The first entry copied whole, the second half-way."""
    def copy_rows(layout, start, stop, src, *args, **kwargs):
        layout.leaves[0][start:stop].copy_(src[0])
        half = start + (stop - start + 1) // 2
        layout.leaves[1][start:half].copy_(src[1][:half - start])
        killed.die()

    TensorLayout.copy_rows = copy_rows  # type: ignore[method-assign]


def die_after_copy(killed, rb) -> None:
    """Every row copied, the count not yet."""
    real = TensorLayout.install_rows

    def install_rows(layout, n, data):
        real(layout, n, data)
        killed.die()

    TensorLayout.install_rows = install_rows  # type: ignore[method-assign]


def die_after_count(killed, rb) -> None:
    """The storage's rows and count installed, the lock not yet released."""
    storage = rb.storage
    real = storage._set_rows_written

    def set_rows_written(n):
        real(n)
        killed.die()

    storage._set_rows_written = set_rows_written


def die_before_writer(killed, rb) -> None:
    """``rb.loads``: the storage installed, the writer's cursor not yet."""
    def load_state_dict(self, state):
        killed.die()

    type(rb.writer).load_state_dict = load_state_dict  # type: ignore[method-assign]


def die_before_release(killed, rb) -> None:
    """``rb.loads``: everything installed, the buffer's lock (the storage's) not released."""
    real = type(rb)._install

    def install(self, steps):
        real(self, steps)
        killed.die()

    type(rb)._install = install  # type: ignore[method-assign]


STORAGE_POINTS = {"before the first row": die_before_first_row, "mid-copy": die_mid_copy,
                  "after the copy": die_after_copy, "after the count": die_after_count}
BUFFER_POINTS = {**STORAGE_POINTS, "before the writer": die_before_writer,
                 "before the release": die_before_release}


def load_and_die(killed, rb, ckpt, point: str, how: str) -> None:
    if how == "load_state_dict":  # (read before the patches: they would kill this load)
        source = LazyTensorStorage(CAP)
        source.loads(ckpt.with_suffix(".storage"))
        state = source.state_dict()
    BUFFER_POINTS[point](killed, rb)
    if how == "rb.loads":
        rb.loads(ckpt)
    elif how == "storage.loads":
        rb.storage.loads(ckpt.with_suffix(".storage"))
    else:
        rb.storage.load_state_dict(state)


# ---- what the other processes see ------------------------------------------------------------
def assert_as_before(rb: ReplayBuffer, old: str, undone: bool = True) -> None:
    """The buffer (mapped before the loader died, or opened after) as before the load; no
    record left, nor (``undone``: a recovery removed it) the journal file."""
    written, ids, cursor = OLD[old]
    storage = rb.storage
    assert read_ids(storage) == ids
    assert len(rb) == len(ids)
    counters = storage.shared_writer_counters()
    assert int(counters[0]) == cursor and int(counters[1]) == len(written)
    batch = rb.sample()
    assert set(batch["id"].tolist()) <= set(ids)
    assert bool((batch["a"] == batch["id"].double().unsqueeze(-1)).all())
    assert not storage._torn.pending
    assert not undone or not (storage.scratch_dir / UNDO_FILE).exists()


def goes_on(rb: ReplayBuffer, old: str) -> None:
    """The next extend writes at the old cursor."""
    _, ids, cursor = OLD[old]
    rb.extend(rows([200, 201]))
    expected = list(ids) + [None] * (CAP - len(ids))
    expected[cursor:cursor + 2] = [200, 201]
    assert read_ids(rb.storage) == [i for i in expected if i is not None]


def fresh_process_sees_old(path, old: str) -> None:
    rb = buffer(path, existsok=True)
    assert_as_before(rb, old)


def run_case(tmp_path, killed, old: str, n: int, point: str, how: str, first: str) -> None:
    ckpt = checkpoint(tmp_path, n)
    rb = shared(tmp_path, old)
    killed.run_killed(load_and_die, killed, rb, ckpt, point, how)
    if first == "fresh":  # a fresh process finds the dead loader's record (and undoes it)
        assert killed.run(fresh_process_sees_old, tmp_path / "s", old) == 0
        assert_as_before(rb, old)
    else:  # the live buffer finds it
        assert_as_before(rb, old)
        assert killed.run(fresh_process_sees_old, tmp_path / "s", old) == 0
    goes_on(rb, old)


@pytest.mark.parametrize("first", ["live", "fresh"])
@pytest.mark.parametrize("point", sorted(BUFFER_POINTS))
@pytest.mark.parametrize("n", LOADED)
@pytest.mark.parametrize("old", sorted(OLD))
def test_killed_buffer_load_leaves_the_buffer_as_it_was(tmp_path, killed, old, n, point, first):
    run_case(tmp_path, killed, old, n, point, "rb.loads", first)


@pytest.mark.parametrize("how", ["storage.loads", "load_state_dict"])
@pytest.mark.parametrize("point", sorted(STORAGE_POINTS))
@pytest.mark.parametrize("n", LOADED)
def test_killed_storage_load_leaves_the_storage_as_it_was(tmp_path, killed, n, point, how):
    run_case(tmp_path, killed, "partial", n, point, how, "live")


def test_killed_load_of_an_empty_checkpoint_leaves_the_buffer_as_it_was(tmp_path, killed):
    empty = buffer(tmp_path / "empty")
    empty.dumps(tmp_path / "ck0")
    rb = shared(tmp_path, "ring")
    killed.run_killed(load_and_die, killed, rb, tmp_path / "ck0", "before the writer",
                      "rb.loads")
    assert_as_before(rb, "ring")
    assert killed.run(fresh_process_sees_old, tmp_path / "s", "ring") == 0
    goes_on(rb, "ring")


@pytest.mark.parametrize("n", LOADED)
@pytest.mark.parametrize("old", sorted(OLD))
def test_completed_load_leaves_the_checkpoint_and_no_record(tmp_path, killed, old, n):
    rb = shared(tmp_path, old)
    rb.loads(checkpoint(tmp_path, n))
    new = list(range(100, 100 + n))
    for view in (rb, buffer(tmp_path / "s", existsok=True)):
        assert read_ids(view.storage) == new and len(view) == n
        counters = view.storage.shared_writer_counters()
        assert int(counters[0]) == n % CAP and int(counters[1]) == n
        assert not view.storage._torn.pending
    rb.extend(rows([200]))
    assert read_ids(rb.storage) == ([*new, 200] if n < CAP else [200, *new[1:]])


def test_load_that_raises_mid_copy_writes_the_old_rows_back(tmp_path, monkeypatch):
    rb = shared(tmp_path, "ring")
    ckpt = checkpoint(tmp_path, 5)
    real = TensorLayout.copy_rows

    def copy_rows(layout, start, stop, src, *args, **kwargs):
        layout.leaves[0][start:stop].fill_(7)  # half-way: one entry overwritten
        raise KeyboardInterrupt

    monkeypatch.setattr(TensorLayout, "copy_rows", copy_rows)
    with pytest.raises(KeyboardInterrupt):
        rb.loads(ckpt)
    monkeypatch.setattr(TensorLayout, "copy_rows", real)
    assert_as_before(rb, "ring", undone=False)  # (the loader keeps its journal file open)
    goes_on(rb, "ring")


def test_load_whose_journal_does_not_fit_on_disk_changes_nothing(tmp_path, monkeypatch):
    from tdreplay.storages import _edit_journal

    rb = shared(tmp_path, "ring")
    ckpt = checkpoint(tmp_path, 8)
    real = _edit_journal._pwrite
    calls = []

    def pwrite(fd, data, offset):
        calls.append(offset)
        if len(calls) == 4:  # (the file's magic, the counters' segment) the rows' segment not
            raise OSError(28, "No space left on device")
        return real(fd, data, offset)

    monkeypatch.setattr(_edit_journal, "_pwrite", pwrite)
    with pytest.raises(OSError):
        rb.loads(ckpt)
    monkeypatch.undo()
    assert_as_before(rb, "ring", undone=False)
    rb.loads(ckpt)  # room again: the load goes through
    assert read_ids(rb.storage) == list(range(100, 108)) and len(rb) == 8
