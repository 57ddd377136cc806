"""Boolean arguments of the storages take a bool (or a numpy bool) and nothing else: ``"yes"``,
``1``, ``"False"`` (truthy in TorchRL) or ``None`` raise a ``TypeError`` naming the argument
before anything is made or changed (no scratch directory is left behind, a written storage
keeps its rows). ``auto_cleanup`` still takes ``None`` (its default: decided by
``scratch_dir``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ReplayBuffer, TensorDictReplayBuffer, testing
from tdreplay.core.testing import assert_same, buffer_snapshot
from tdreplay.storages import (
    CompressedListStorage,
    LazyMemmapStorage,
    LazyStackStorage,
    LazyTensorStorage,
    TensorStorage,
)

BAD = testing.NOT_BOOLS
GOOD = testing.BOOLS


def data(n: int, start: float = 0.0) -> TensorDict:
    return TensorDict({"x": torch.arange(start, start + n)}, [n])


def memmap(tmp: Path, **kwargs: Any) -> LazyMemmapStorage:
    return LazyMemmapStorage(4, scratch_dir=tmp / "scratch", **kwargs)


# ---- constructors ------------------------------------------------------------------------------
CONSTRUCTORS: list[tuple[str, Callable[..., Any], str, str | None]] = [
    # (id, build(tmp_path, **{name: value}), name, attribute holding it (None: none))
    ("TensorStorage", lambda tmp, **kw: TensorStorage(data(4), **kw), "compilable", "compilable"),
    ("LazyTensorStorage", lambda tmp, **kw: LazyTensorStorage(4, **kw), "compilable",
     "compilable"),
    ("LazyTensorStorage", lambda tmp, **kw: LazyTensorStorage(4, **kw), "consolidated",
     "consolidated"),
    ("LazyTensorStorage", lambda tmp, **kw: LazyTensorStorage(4, **kw), "cleanup_memmap",
     "cleanup_memmap"),
    ("LazyTensorStorage", lambda tmp, **kw: LazyTensorStorage(4, **kw), "shared_init",
     "shared_init"),
    ("LazyMemmapStorage", memmap, "existsok", "existsok"),
    ("LazyMemmapStorage", memmap, "compilable", None),
    ("LazyMemmapStorage", memmap, "shared_init", None),
    ("LazyStackStorage", lambda tmp, **kw: LazyStackStorage(4, **kw), "compilable",
     "compilable"),
    ("CompressedListStorage", lambda tmp, **kw: CompressedListStorage(4, **kw), "compilable",
     "compilable"),
]
IDS = [f"{c[0]}-{c[2]}" for c in CONSTRUCTORS]


@pytest.mark.parametrize("value", BAD)
@pytest.mark.parametrize("owner, build, name, attribute", CONSTRUCTORS, ids=IDS)
def test_constructors_refuse_a_flag_that_is_not_a_bool(tmp_path, owner, build, name, attribute,
                                                       value):
    with pytest.raises(TypeError, match=f"{name} must be a bool, got"):
        build(tmp_path, **{name: value})
    assert not (tmp_path / "scratch").exists()  # (a memmap storage made no directory)


@pytest.mark.parametrize("value", GOOD)
@pytest.mark.parametrize("owner, build, name, attribute", CONSTRUCTORS, ids=IDS)
def test_constructors_take_bools_and_numpy_bools(tmp_path, owner, build, name, attribute, value):
    storage = build(tmp_path, **{name: value})
    if attribute is not None:
        got = getattr(storage, attribute)
        assert type(got) is bool and got == bool(value)
    rb = TensorDictReplayBuffer(storage=storage)
    if owner != "TensorStorage":  # (a full TensorStorage over its data is written already)
        rb.extend(data(3))
        assert len(rb) == 3 and rb[:]["x"].tolist() == [0.0, 1.0, 2.0]


@pytest.mark.parametrize("value", ["yes", 1, 0, torch.tensor(False)])
def test_memmap_auto_cleanup_refuses_what_is_not_a_bool_or_none(tmp_path, value):
    with pytest.raises(TypeError, match="auto_cleanup must be a bool or None"):
        memmap(tmp_path, auto_cleanup=value)
    assert not (tmp_path / "scratch").exists()


@pytest.mark.parametrize("value, removed", [(None, False), (True, True), (False, False),
                                            (np.bool_(True), True)])
def test_memmap_auto_cleanup_takes_bools_and_none(tmp_path, value, removed):
    storage = memmap(tmp_path, auto_cleanup=value)
    assert storage.auto_cleanup is removed
    storage.cleanup() if removed else None
    assert (tmp_path / "scratch").exists() is not removed


@pytest.mark.parametrize("value", GOOD)
def test_memmap_existsok_opens_a_used_scratch_dir_only_when_true(tmp_path, value):
    first = memmap(tmp_path)
    first.set(slice(0, 2), data(2))
    if value:
        assert len(memmap(tmp_path, existsok=value)) == 2
    else:
        with pytest.raises(FileExistsError, match="existsok=True"):
            memmap(tmp_path, existsok=value)


# ---- methods of a written storage: refused, the storage unchanged ------------------------------
STORAGES: list[tuple[str, Callable[[Path], Any]]] = [
    ("LazyTensorStorage", lambda tmp: LazyTensorStorage(10)),
    ("LazyMemmapStorage", lambda tmp: LazyMemmapStorage(10, scratch_dir=tmp / "m")),
    ("CompressedListStorage", lambda tmp: CompressedListStorage(10)),
    ("LazyStackStorage", lambda tmp: LazyStackStorage(10)),
]


def filled(tmp: Path, make: Callable[[Path], Any]) -> ReplayBuffer:
    rb = TensorDictReplayBuffer(storage=make(tmp), batch_size=3)
    rb.extend(data(6))
    return rb


def rows(rb: ReplayBuffer) -> list[float]:
    return rb[:]["x"].tolist()


@pytest.mark.parametrize("value", BAD)
@pytest.mark.parametrize("kind, make", STORAGES, ids=[s[0] for s in STORAGES])
def test_set_refuses_a_set_cursor_that_is_not_a_bool(tmp_path, kind, make, value):
    rb = filled(tmp_path, make)
    # (buffer_snapshot cannot copy the CompressedRow named tuples of a compressed storage)
    snapshot = kind != "CompressedListStorage"
    before, last = buffer_snapshot(rb) if snapshot else None, rb.storage.last_written_row
    with pytest.raises(TypeError, match="set_cursor must be a bool, got"):
        rb.storage.set(0, TensorDict({"x": torch.tensor(-1.0)}, []), set_cursor=value)
    assert rows(rb) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0] and len(rb) == 6
    assert rb.storage.last_written_row == last
    if snapshot:
        assert_same(buffer_snapshot(rb), before, "buffer state")


@pytest.mark.parametrize("value", GOOD)
@pytest.mark.parametrize("kind, make", STORAGES, ids=[s[0] for s in STORAGES])
def test_set_takes_bools_and_numpy_bools(tmp_path, kind, make, value):
    rb, plain = filled(tmp_path / "a", make), filled(tmp_path / "b", make)
    rb.storage.set(0, TensorDict({"x": torch.tensor(-1.0)}, []), set_cursor=value)
    plain.storage.set(0, TensorDict({"x": torch.tensor(-1.0)}, []), set_cursor=bool(value))
    assert rows(rb) == rows(plain) == [-1.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert rb.storage.last_written_row == plain.storage.last_written_row


@pytest.mark.parametrize("value", BAD)
@pytest.mark.parametrize("kind, make", STORAGES[:2], ids=[s[0] for s in STORAGES[:2]])
def test_update_refuses_a_clone_that_is_not_a_bool(tmp_path, kind, make, value):
    rb = filled(tmp_path, make)
    torch.manual_seed(0)
    before = rb.sample()["x"].tolist()
    with pytest.raises(TypeError, match="clone must be a bool, got"):
        rb.storage.update_(TensorDict({"x": torch.zeros(6)}, [6]), clone=value)
    with pytest.raises(TypeError, match="clone must be a bool, got"):
        rb.update_(TensorDict({"x": torch.zeros(6)}, [6]), clone=value)
    assert rows(rb) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    torch.manual_seed(0)
    assert rb.sample()["x"].tolist() == before


@pytest.mark.parametrize("value", GOOD)
@pytest.mark.parametrize("kind, make", STORAGES[:2], ids=[s[0] for s in STORAGES[:2]])
def test_update_takes_bools_and_numpy_bools(tmp_path, kind, make, value):
    rb = filled(tmp_path, make)
    rb.update_(TensorDict({"x": torch.zeros(6)}, [6]), clone=value)
    assert rows(rb) == [0.0] * 6
