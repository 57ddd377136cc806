"""Bad ``stack_dim`` (``LazyStackStorage``) and ``scratch_dir`` (``LazyMemmapStorage``) are
refused with an error naming the argument, and nothing is written."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ReplayBuffer, TensorDictReplayBuffer
from tdreplay.core.testing import assert_same, buffer_snapshot
from tdreplay.storages import LazyMemmapStorage, LazyStackStorage


@pytest.mark.parametrize("bad", ["0", 1.0, None, True, torch.tensor(0), [0]])
def test_stack_dim_not_an_int_is_refused(bad: object) -> None:
    with pytest.raises(TypeError, match="stack_dim"):
        LazyStackStorage(8, stack_dim=bad)


def test_stack_dim_numpy_int_is_an_int() -> None:
    storage = LazyStackStorage(8, stack_dim=np.int64(-1))
    assert storage.stack_dim == -1 and type(storage.stack_dim) is int


@pytest.mark.filterwarnings("ignore:Using `add\\(\\)` with a TensorDict")
@pytest.mark.parametrize("stack_dim", [2, 5, -3, -7])
def test_stack_dim_out_of_range_is_refused_at_the_write(stack_dim: int) -> None:
    rb = TensorDictReplayBuffer(storage=LazyStackStorage(8, stack_dim=stack_dim), batch_size=2)
    before = buffer_snapshot(rb)
    steps = TensorDict({"obs": torch.randn(4, 3, 2)}, [4, 3])  # items of 1 batch dim
    with pytest.raises(ValueError, match=rf"stack_dim={stack_dim} .*\[-2, 1\]"):
        rb.extend(steps)
    with pytest.raises(ValueError, match="stack_dim"):
        rb.add(steps[0])  # one item: a TensorDict of 1 batch dim
    assert_same(buffer_snapshot(rb), before)
    assert len(rb) == 0
    rb_list = ReplayBuffer(storage=LazyStackStorage(8, stack_dim=stack_dim), batch_size=2)
    before = buffer_snapshot(rb_list)
    with pytest.raises(ValueError, match="stack_dim"):
        rb_list.extend([steps[0], steps[1]])  # a list of items
    assert_same(buffer_snapshot(rb_list), before)
    assert len(rb_list) == 0


@pytest.mark.filterwarnings("ignore:sample info 'index'")  # stack_dim != 0: info only
@pytest.mark.parametrize("stack_dim", [-2, -1, 0, 1])
def test_stack_dim_in_range_reads_back(stack_dim: int) -> None:
    rb = TensorDictReplayBuffer(storage=LazyStackStorage(8, stack_dim=stack_dim), batch_size=2)
    rb.extend(TensorDict({"obs": torch.randn(4, 3, 2)}, [4, 3]))
    assert rb[:].batch_size == ((4, 3) if stack_dim in (0, -2) else (3, 4))
    assert rb.sample()["obs"].numel() == 12


def test_stack_dim_checks_tensors_and_leaves_other_items() -> None:
    rb = ReplayBuffer(storage=LazyStackStorage(8, stack_dim=2), batch_size=2)
    with pytest.raises(ValueError, match="stack_dim=2"):
        rb.extend(torch.zeros(4, 3))  # items of 1 dim
    assert len(rb) == 0
    rb.extend(["a", "b"])  # never stacked: stack_dim does not matter
    assert rb[:] == ["a", "b"]


@pytest.mark.parametrize("bad", [5, [".", "x"], b"scratch", 1.5])
def test_scratch_dir_of_a_wrong_type_is_refused(bad: object) -> None:
    with pytest.raises(TypeError, match="scratch_dir"):
        LazyMemmapStorage(8, scratch_dir=bad)


def test_empty_scratch_dir_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="scratch_dir"):
        LazyMemmapStorage(8, scratch_dir="")
    assert os.listdir(tmp_path) == []  # nothing written into the working directory


def test_scratch_dir_naming_a_file_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "data.bin"
    file.write_bytes(b"keep")
    for where in (file, file / "below"):
        with pytest.raises(NotADirectoryError, match="scratch_dir"):
            LazyMemmapStorage(8, scratch_dir=where)
    assert file.read_bytes() == b"keep" and os.listdir(tmp_path) == ["data.bin"]


def test_scratch_dir_directory_still_works(tmp_path: Path) -> None:
    for where in (tmp_path, tmp_path / "new" / "dir", str(tmp_path / "as_str")):
        storage = LazyMemmapStorage(8, scratch_dir=where)
        rb = TensorDictReplayBuffer(storage=storage, batch_size=2)
        rb.extend(TensorDict({"a": torch.arange(3)}, [3]))
        assert storage.scratch_dir == Path(where).resolve() and len(rb) == 3
        storage.cleanup()


def test_a_temporary_directory_object_is_its_directory(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """TorchRL's tutorial passes the ``TemporaryDirectory`` itself (TorchRL then writes into a
    directory named after its repr, in the working directory)."""
    import tempfile

    monkeypatch.chdir(tmp_path)
    holder = tempfile.TemporaryDirectory(dir=tmp_path)
    storage = LazyMemmapStorage(8, scratch_dir=holder)
    rb = TensorDictReplayBuffer(storage=storage, batch_size=2)
    rb.extend(TensorDict({"a": torch.arange(3)}, [3]))
    assert storage.scratch_dir == Path(holder.name).resolve() and len(rb) == 3
    assert os.listdir(tmp_path) == [os.path.basename(holder.name)]  # nothing else written
    assert not storage.auto_cleanup  # (the TemporaryDirectory removes it)
    del rb, storage
    holder.cleanup()
