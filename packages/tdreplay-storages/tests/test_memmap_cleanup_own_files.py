"""``LazyMemmapStorage.cleanup()`` and ``auto_cleanup`` remove only what the storage created:
its data files (and the directories of nested keys when left empty), its own state, config,
lock and journal files, then ``scratch_dir`` when empty. A user's files in the directory stay
(TorchRL removes the whole directory); a temporary directory the storage made goes whole."""

from __future__ import annotations

import gc
import json
import os
from pathlib import Path

import torch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.storages import LazyMemmapStorage


def _data(n: int = 3) -> TensorDict:
    return TensorDict({"obs": torch.arange(n, dtype=torch.float32),
                       ("next", "obs"): torch.arange(1, n + 1, dtype=torch.float32)}, [n])


def _user_dir(tmp_path: Path) -> Path:
    mine = tmp_path / "my_project"
    mine.mkdir()
    (mine / "notes.txt").write_text("precious notes")
    return mine


def test_cleanup_keeps_a_users_files_the_first_write_refused_to_overwrite(tmp_path):
    mine = _user_dir(tmp_path)
    (mine / "obs.memmap").write_text("precious data")
    storage = LazyMemmapStorage(10, scratch_dir=mine)
    rb = TensorDictReplayBuffer(storage=storage)
    try:
        rb.extend(_data())
    except FileExistsError as err:
        assert "obs.memmap" in str(err)
    else:
        raise AssertionError("the first write overwrote the user's obs.memmap")
    assert storage.cleanup() is False  # nothing was written
    assert sorted(os.listdir(mine)) == ["notes.txt", "obs.memmap"]
    assert (mine / "notes.txt").read_text() == "precious notes"
    assert (mine / "obs.memmap").read_text() == "precious data"


def test_cleanup_of_written_data_removes_the_storages_files_and_keeps_the_users(tmp_path):
    mine = _user_dir(tmp_path)
    (mine / "next").mkdir()
    (mine / "next" / "mine.txt").write_text("mine too")
    storage = LazyMemmapStorage(10, scratch_dir=mine)
    rb = TensorDictReplayBuffer(storage=storage)
    rb.extend(_data())
    assert (mine / "obs.memmap").is_file() and (mine / "next" / "obs.memmap").is_file()
    assert storage.cleanup() is True  # written data removed
    # what is left is the user's, untouched; nothing of the storage's
    assert sorted(os.listdir(mine)) == ["next", "notes.txt"]
    assert os.listdir(mine / "next") == ["mine.txt"]
    assert (mine / "notes.txt").read_text() == "precious notes"
    assert (mine / "next" / "mine.txt").read_text() == "mine too"
    assert storage.cleanup() is False  # nothing left to remove


def test_cleanup_removes_the_directories_of_nested_keys_it_made_and_an_empty_scratch_dir(
        tmp_path):
    scratch = tmp_path / "scratch"
    storage = LazyMemmapStorage(10, scratch_dir=scratch)
    storage.set(slice(0, 3), TensorDict({("a", "b", "c"): torch.ones(3)}, [3]))
    assert (scratch / "a" / "b" / "c.memmap").is_file()
    assert storage.cleanup() is True
    assert not scratch.exists()  # emptied: removed, as before
    assert os.listdir(tmp_path) == []


def test_auto_cleanup_keeps_a_users_files(tmp_path):
    mine = _user_dir(tmp_path)
    storage = LazyMemmapStorage(10, scratch_dir=mine, auto_cleanup=True)
    rb = TensorDictReplayBuffer(storage=storage)
    rb.extend(_data())
    del rb, storage
    gc.collect()
    assert os.listdir(mine) == ["notes.txt"]
    assert (mine / "notes.txt").read_text() == "precious notes"


def test_auto_cleanup_of_a_reopened_storage_removes_its_files_not_the_users(tmp_path):
    mine = _user_dir(tmp_path)
    first = LazyMemmapStorage(10, scratch_dir=mine)
    first.set(slice(0, 3), _data())
    del first
    gc.collect()
    reopened = LazyMemmapStorage(10, scratch_dir=mine, existsok=True, auto_cleanup=True)
    assert len(reopened) == 3  # the files another storage laid out are the storage's
    del reopened
    gc.collect()
    assert os.listdir(mine) == ["notes.txt"]


def test_cleanup_removes_the_files_a_dead_first_write_listed(tmp_path):
    """A first write that died leaves the files it created listed in the creation list: they
    are the storage's, and go with it."""
    mine = _user_dir(tmp_path)
    storage = LazyMemmapStorage(10, scratch_dir=mine)
    (mine / "half.memmap").write_bytes(b"\0" * 16)
    (mine / "tdreplay-memmap-creating.json").write_text(
        json.dumps({"pid": 0, "created": ["half.memmap"]}))
    assert storage.cleanup() is False
    assert os.listdir(mine) == ["notes.txt"]


def test_a_temporary_directory_the_storage_made_goes_whole():
    storage = LazyMemmapStorage(10)
    storage.set(slice(0, 3), _data())
    scratch = storage.scratch_dir
    (scratch / "extra.txt").write_text("in the storage's own temporary directory")
    assert storage.cleanup() is True
    assert not scratch.exists()


def test_the_temporary_directory_goes_with_its_storage():
    storage = LazyMemmapStorage(10)
    storage.set(slice(0, 3), _data())
    scratch = storage.scratch_dir
    del storage
    gc.collect()
    assert not scratch.exists()
