"""The compacting checkpointers (flat, nested, H5) and TED data: they refuse the TED format
hooks (which would hand them data in another format), compact an ``ndim=2`` storage along its
time dim (its rows are laid out ``[time, envs]``), and a checkpoint saved through ``TED2Flat``
loaded without ``Flat2TED`` says which load hook it needs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.core.checkpoint import CheckpointError
from tdreplay.core.testing import assert_same
from tdreplay.storages import (
    Flat2TED,
    FlatStorageCheckpointer,
    H5Combine,
    H5Split,
    LazyTensorStorage,
    Nested2TED,
    NestedStorageCheckpointer,
    TED2Flat,
    TED2Nested,
)

COMPACTING = [FlatStorageCheckpointer, NestedStorageCheckpointer]


def _ted(envs: int, steps: int) -> TensorDict:
    """``[envs, steps]`` TED rows: each env's next obs is its obs one step later."""
    obs = torch.arange(envs * (steps + 1), dtype=torch.float32).reshape(envs, steps + 1)
    done = torch.zeros(envs, steps, 1, dtype=torch.bool)
    done[:, -1] = True
    return TensorDict({"obs": obs[:, :-1], "next": {"obs": obs[:, 1:], "done": done,
                                                    "reward": torch.ones(envs, steps, 1)}},
                      [envs, steps])


@pytest.mark.parametrize("checkpointer", COMPACTING)
@pytest.mark.parametrize("hook", [TED2Flat, TED2Nested, H5Split])
def test_ted_save_hooks_are_refused(checkpointer: type, hook: type) -> None:
    ckpt = checkpointer()
    with pytest.raises(ValueError, match=f"{checkpointer.__name__} compacts TED data itself.*"
                                         f"{hook.__name__}"):
        ckpt.register_save_hook(hook())
    assert ckpt.save_hooks == ()
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8), checkpointer=checkpointer())
    with pytest.raises(ValueError, match="compacts TED data itself"):  # through the buffer
        rb.register_save_hook(hook())
    assert rb.storage.checkpointer.save_hooks == ()


@pytest.mark.parametrize("checkpointer", COMPACTING)
@pytest.mark.parametrize("hook", [Flat2TED, Nested2TED, H5Combine])
def test_ted_load_hooks_are_refused(checkpointer: type, hook: type) -> None:
    ckpt = checkpointer()
    with pytest.raises(ValueError, match="compacts TED data itself"):
        ckpt.register_load_hook(hook())
    assert ckpt.load_hooks == ()


@pytest.mark.parametrize("checkpointer", COMPACTING)
def test_other_hooks_still_register(checkpointer: type, tmp_path: Path) -> None:
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8), checkpointer=checkpointer())
    rb.register_save_hook(lambda rows: rows.apply(lambda x: x * 2))
    rb.extend(_ted(1, 4)[0])
    rb.dumps(tmp_path)
    restored = TensorDictReplayBuffer(storage=LazyTensorStorage(8), checkpointer=checkpointer())
    restored.loads(tmp_path)
    assert restored[:]["obs"].tolist() == [0.0, 2.0, 4.0, 6.0]


@pytest.mark.parametrize("checkpointer", COMPACTING)
@pytest.mark.parametrize("extends", [1, 2], ids=["filling", "wrapped"])
def test_ndim2_storage_is_compacted_along_time(checkpointer: type, extends: int,
                                               tmp_path: Path) -> None:
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(12, ndim=2),
                                checkpointer=checkpointer())
    for i in range(extends):
        rb.extend(_ted(2, 4 if i == 0 else 3))
    rb.dumps(tmp_path)
    meta = json.loads(next(tmp_path.rglob("storage.json")).read_text())
    assert meta["time_dim"] == 0
    shifted = {tuple(e["key"]): e for e in meta["entries"] if e["stored"] == "shifted"}
    # 2 envs, [time, envs] rows: one explicit next obs per env where its steps stop following
    # each other: the last row (filling); wrapped (6 rows: the second batch's steps 0, 1 in
    # rows 4, 5 and its step 2 in row 0), after rows 0, 3 and 5
    assert set(shifted) == {("next", "obs")}
    assert shifted[("next", "obs")]["explicit"] == {1: 2, 2: 6}[extends]
    restored = TensorDictReplayBuffer(storage=LazyTensorStorage(12, ndim=2),
                                      checkpointer=checkpointer())
    restored.loads(tmp_path)
    assert_same(restored[:], rb[:])
    assert_same(restored.storage.shape, rb.storage.shape)


def test_checkpoint_without_time_dim_is_read_along_the_last_dim(tmp_path: Path) -> None:
    """A checkpoint written before ``time_dim`` was recorded (compacted along the last batch
    dim) loads as it was saved."""
    storage = LazyTensorStorage(6, checkpointer=FlatStorageCheckpointer())
    storage.set(range(3), _ted(3, 4))  # items of [4] steps each: the last dim is time
    storage.checkpointer.dumps(storage, tmp_path)
    meta = json.loads((tmp_path / "storage.json").read_text())
    assert meta.pop("time_dim") == 1
    (tmp_path / "storage.json").write_text(json.dumps(meta))
    target = LazyTensorStorage(6, checkpointer=FlatStorageCheckpointer())
    target.checkpointer.loads(target, tmp_path)
    assert_same(target[:], storage[:])


def test_bad_time_dim_is_refused(tmp_path: Path) -> None:
    storage = LazyTensorStorage(6, checkpointer=FlatStorageCheckpointer())
    storage.set(range(3), _ted(3, 4))
    storage.checkpointer.dumps(storage, tmp_path)
    meta = json.loads((tmp_path / "storage.json").read_text())
    meta["time_dim"] = 5
    (tmp_path / "storage.json").write_text(json.dumps(meta))
    target = LazyTensorStorage(6, checkpointer=FlatStorageCheckpointer())
    with pytest.raises(CheckpointError, match="time_dim 5 is not a dim"):
        target.checkpointer.loads(target, tmp_path)
    assert len(target) == 0


def test_ted2flat_checkpoint_without_its_load_hook_names_it(tmp_path: Path) -> None:
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8))
    rb.register_save_hook(TED2Flat())
    rb.extend(_ted(1, 4)[0])
    rb.dumps(tmp_path)
    other = TensorDictReplayBuffer(storage=LazyTensorStorage(8))
    with pytest.raises(CheckpointError, match=r"register_load_hook\(Flat2TED\(\)\)"):
        other.loads(tmp_path)
    assert len(other) == 0
