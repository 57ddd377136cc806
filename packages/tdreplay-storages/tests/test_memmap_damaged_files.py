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
