"""A LazyMemmapStorage reopened from a scratch_dir whose files were damaged refuses with a
DamagedStorageError naming the file, instead of mapping zeros where committed rows were (a
missing or truncated data file was re-created or zero-extended, a zeroed state file showed an
empty buffer over the rows)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ReplayBuffer
from tdreplay.storages import LazyMemmapStorage
from tdreplay.storages.memmap_storage import DamagedStorageError

ROWS = 20


def written(path) -> None:
    rb = ReplayBuffer(storage=LazyMemmapStorage(100, scratch_dir=path))
    rb.extend(TensorDict({"x": torch.arange(1.0, ROWS + 1), "y": torch.arange(ROWS)}, [ROWS]))


def reopened(path) -> ReplayBuffer:
    rb = ReplayBuffer(storage=LazyMemmapStorage(100, scratch_dir=path, existsok=True))
    len(rb)  # (maps the files)
    return rb


def test_an_undamaged_storage_reopens_with_its_rows(tmp_path):
    written(tmp_path)
    rb = reopened(tmp_path)
    assert rb[:]["x"].tolist() == [float(i) for i in range(1, ROWS + 1)]


@pytest.mark.parametrize("damage, message", [
    (lambda f: os.truncate(f, 100), r"x\.memmap' of this memory-mapped storage holds 100 bytes, "
                                    r"its layout 400: it was truncated"),
    (lambda f: os.truncate(f, 0), r"holds 0 bytes"),
    (os.remove, r"x\.memmap' of this memory-mapped storage is missing"),
])
def test_a_missing_or_truncated_data_file_is_refused(tmp_path, damage, message):
    written(tmp_path)
    damage(tmp_path / "x.memmap")
    with pytest.raises(DamagedStorageError, match=message):
        reopened(tmp_path)
    assert not (tmp_path / "x.memmap").exists() or os.path.getsize(tmp_path / "x.memmap") < 400


@pytest.mark.parametrize("name", ["tdreplay-memmap-layout.json", "tdreplay-memmap.json"])
def test_a_json_record_that_does_not_parse_is_named(tmp_path, name):
    written(tmp_path)
    (tmp_path / name).write_text('{"leaves": [')
    with pytest.raises(DamagedStorageError, match=rf"{name}' cannot be read"):
        reopened(tmp_path)


def test_a_row_count_past_the_capacity_is_refused(tmp_path):
    written(tmp_path)
    counters = np.memmap(tmp_path / "tdreplay-memmap-state.bin", dtype=np.int64, mode="r+")
    counters[1] = 5000  # the row count
    counters.flush()
    del counters
    with pytest.raises(DamagedStorageError, match="counts 5000 rows written in a storage of 100"):
        reopened(tmp_path)


def test_a_zeroed_state_file_is_refused(tmp_path):
    written(tmp_path)
    state = tmp_path / "tdreplay-memmap-state.bin"
    state.write_bytes(bytes(os.path.getsize(state)))
    with pytest.raises(DamagedStorageError, match="says nothing was written"):
        reopened(tmp_path)


@pytest.mark.parametrize("existsok", [True, False])
def test_a_missing_config_file_is_refused_and_the_state_kept(tmp_path, existsok):
    # (the storage took the directory for a new one and zeroed its state file: the row count,
    # cursor and write count of 20 committed rows were lost for good)
    written(tmp_path)
    state = (tmp_path / "tdreplay-memmap-state.bin").read_bytes()
    config = tmp_path / "tdreplay-memmap.json"
    saved = config.read_text()
    config.unlink()
    with pytest.raises(DamagedStorageError, match="tdreplay-memmap.json: its configuration"):
        ReplayBuffer(storage=LazyMemmapStorage(100, scratch_dir=tmp_path, existsok=existsok))
    assert (tmp_path / "tdreplay-memmap-state.bin").read_bytes() == state
    config.write_text(saved)
    assert reopened(tmp_path)[:]["y"].tolist() == list(range(ROWS))


def test_a_data_file_replaced_by_a_directory_is_refused(tmp_path):
    written(tmp_path)
    (tmp_path / "x.memmap").unlink()
    (tmp_path / "x.memmap").mkdir()
    with pytest.raises(DamagedStorageError, match=r"x\.memmap' .* is not a regular file"):
        reopened(tmp_path)


def test_a_missing_state_file_is_refused(tmp_path):
    written(tmp_path)
    (tmp_path / "tdreplay-memmap-state.bin").unlink()
    with pytest.raises(DamagedStorageError, match="no state file .*tdreplay-memmap-state.bin"):
        reopened(tmp_path)
    assert not (tmp_path / "tdreplay-memmap-state.bin").exists()  # (nothing made in its place)


def test_a_missing_state_file_of_a_storage_never_written_is_made_afresh(tmp_path):
    ReplayBuffer(storage=LazyMemmapStorage(100, scratch_dir=tmp_path))  # (nothing laid out)
    (tmp_path / "tdreplay-memmap-state.bin").unlink()
    rb = reopened(tmp_path)
    rb.extend(torch.arange(3.0))
    assert rb[:].tolist() == [0.0, 1.0, 2.0]


TORN = 4  # the state file's slot that records a write in flight (see _torn_writes)


@pytest.mark.parametrize("value", [
    0x7FF,  # a "range round the end" of 511 rows in a storage of 100
    (5 << 33) | (2 << 2) | 3,  # a range that stops before it starts
    -1, -4, 16,  # no kind of record at all
    (1 << 4) | 1,  # a range record with other bits set
])
def test_a_damaged_record_of_a_write_in_flight_drops_no_row(tmp_path, value):
    # (the reopen took the garbage for a write that died over rows [0, 511) and dropped every
    # committed row: len 0)
    written(tmp_path)
    state = tmp_path / "tdreplay-memmap-state.bin"
    counters = np.memmap(state, dtype=np.int64, mode="r+")
    counters[TORN] = value
    counters.flush()
    del counters
    before = state.read_bytes()
    with pytest.raises(DamagedStorageError, match="records an unfinished write .* no writer"):
        reopened(tmp_path)
    assert state.read_bytes() == before
    counters = np.memmap(state, dtype=np.int64, mode="r+")
    counters[TORN] = 0  # (put right by hand: the rows were never touched)
    counters.flush()
    del counters
    assert reopened(tmp_path)[:]["y"].tolist() == list(range(ROWS))


def test_a_recovery_step_past_its_plan_is_refused(tmp_path):
    from tdreplay.storages._torn_writes import PLAN_FILE
    written(tmp_path)
    counters = np.memmap(tmp_path / "tdreplay-memmap-state.bin", dtype=np.int64, mode="r+")
    # a plan dropping row 3 of 20 (cursor 20: 16 moves of one row at most), then the record
    # "moving, step 900" that no recovery of it reaches
    header = [0x3165766F_6D726474, ROWS, ROWS, 1, 1, 3]
    (tmp_path / PLAN_FILE).write_bytes(np.array(header, dtype=np.int64).tobytes())
    counters[TORN] = (900 << 4) | 4
    counters.flush()
    del counters
    with pytest.raises(DamagedStorageError, match="records step 900 of a recovery of 16 steps"):
        reopened(tmp_path)


@pytest.mark.parametrize("size", [8, 40, 71, 96])
def test_a_state_file_cut_short_or_grown_is_refused(tmp_path, size):
    # cut to 8 bytes it was zero-extended as an older version's file: the row count read 0
    # and the next write went to row 0 over the committed rows
    written(tmp_path)
    state = tmp_path / "tdreplay-memmap-state.bin"
    with open(state, "r+b") as f:
        f.truncate(size)
    with pytest.raises(DamagedStorageError, match=rf"holds {size} bytes, not the 88"):
        reopened(tmp_path)
    assert os.path.getsize(state) == size  # left as it was


@pytest.mark.parametrize("counters", [8, 9])  # before the reset count, before the last row
def test_a_state_file_of_an_older_version_reopens_with_its_rows(tmp_path, counters):
    written(tmp_path)
    state = tmp_path / "tdreplay-memmap-state.bin"
    with open(state, "r+b") as f:
        f.truncate(counters * 8)
    rb = reopened(tmp_path)
    assert rb[:]["x"].tolist() == [float(i) for i in range(1, ROWS + 1)]
    assert os.path.getsize(state) == 88
    assert rb.storage.last_written_row == ROWS - 1  # (from the shared cursor)


def test_a_config_file_missing_a_setting_is_named(tmp_path):
    # it was read as max_size=None: "holds a storage with max_size=None"
    written(tmp_path)
    config = tmp_path / "tdreplay-memmap.json"
    config.write_text(config.read_text().replace('"max_size"', '"max_s<ze"'))
    with pytest.raises(DamagedStorageError, match=r"tdreplay-memmap.json has no 'max_size'"):
        reopened(tmp_path)
