"""split_trajectories: padding, masks, ids from done flags, keys and bad input."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from tdreplay.core import split_trajectories


def _rollout(ids: torch.Tensor, **extra: torch.Tensor) -> TensorDict:
    shape = ids.shape
    return TensorDict({"obs": torch.arange(ids.numel(), dtype=torch.float32).view(shape),
                       "collector": {"traj_ids": ids}, **extra}, batch_size=shape)


def test_padded_rows_values_and_mask() -> None:
    ids = torch.tensor([[0, 0, 1, 1], [2, 2, 2, 3]])
    out = split_trajectories(_rollout(ids))
    assert out.batch_size == torch.Size([4, 3])
    assert out["obs"].tolist() == [[0, 1, 0], [2, 3, 0], [4, 5, 6], [7, 0, 0]]
    assert out["collector", "mask"].dtype is torch.bool
    assert out["collector", "mask"].tolist() == [
        [True, True, False], [True, True, False], [True, True, True], [True, False, False]]
    assert out["collector", "traj_ids"].tolist() == [[0, 0, 0], [1, 1, 0], [2, 2, 2], [3, 0, 0]]


def test_one_dim_rollout_and_input_untouched() -> None:
    rollout = _rollout(torch.tensor([5, 5, 5, 9, 9]))
    before = rollout.clone()
    out = split_trajectories(rollout)
    assert out.batch_size == torch.Size([2, 3])
    assert out["obs"].tolist() == [[0, 1, 2], [3, 4, 0]]
    assert (rollout == before).all()
    assert ("collector", "mask") not in rollout.keys(include_nested=True)


def test_row_boundary_splits_equal_ids() -> None:
    # the same id at the end of row 0 and the start of row 1 is two trajectories
    out = split_trajectories(_rollout(torch.tensor([[1, 1], [1, 1]])))
    assert out.batch_size == torch.Size([2, 2])
    assert out["collector", "mask"].all()


def test_ids_from_done_flags_without_prefix() -> None:
    done = torch.tensor([0, 0, 1, 0, 1, 0], dtype=torch.bool).unsqueeze(-1)
    rollout = TensorDict({"obs": torch.arange(6.), "next": {"done": done}}, [6])
    out = split_trajectories(rollout)
    assert out.batch_size == torch.Size([3, 3])
    assert out["obs"].tolist() == [[0, 1, 2], [3, 4, 0], [5, 0, 0]]
    assert out["traj_ids"].tolist() == [[0, 0, 0], [1, 1, 0], [2, 0, 0]]
    assert out["mask"].sum().item() == 6
    # the done flags are padded with False
    assert out["next", "done"].shape == torch.Size([3, 3, 1])
    assert out["next", "done"][..., 0].tolist() == [[False, False, True], [False, True, False],
                                                    [False, False, False]]


def test_done_key_forms() -> None:
    flags = torch.tensor([[0, 1, 0], [1, 0, 0]], dtype=torch.bool)
    rollout = TensorDict({"x": torch.ones(2, 3), "next": {"stop": flags}}, [2, 3])
    a = split_trajectories(rollout, done_key="stop")
    b = split_trajectories(rollout, done_key=("next", "stop"))
    assert a.batch_size == b.batch_size == torch.Size([4, 2])
    assert a["mask"].sum(-1).tolist() == [2, 1, 1, 2]
    assert (a["traj_ids"] == b["traj_ids"]).all()


def test_trajectory_key_and_prefix() -> None:
    rollout = TensorDict({"obs": torch.arange(4.), "meta": {"ep": torch.tensor([3, 3, 4, 4])}},
                         [4])
    out = split_trajectories(rollout, trajectory_key=("meta", "ep"))
    assert out["meta", "mask"].all() and out.batch_size == torch.Size([2, 2])
    rollout = TensorDict({"obs": torch.arange(3.), "agent": {"traj_ids": torch.tensor([0, 1, 1])}},
                         [3])
    out = split_trajectories(rollout, prefix="agent")
    assert out["agent", "mask"].tolist() == [[True, False], [True, True]]


def test_nested_output() -> None:
    out = split_trajectories(_rollout(torch.tensor([0, 0, 0, 1, 1])), as_nested=True)
    assert out.batch_size == torch.Size([2])
    assert out["obs"][0].tolist() == [0, 1, 2] and out["obs"][1].tolist() == [3, 4]
    jagged = split_trajectories(_rollout(torch.tensor([0, 1, 1])), as_nested=torch.jagged)
    assert jagged["obs"].layout is torch.jagged


def test_bad_input() -> None:
    with pytest.raises(TypeError, match="TensorDict"):
        split_trajectories(torch.zeros(3))
    with pytest.raises(ValueError, match="at least one batch dimension"):
        split_trajectories(TensorDict({"a": torch.zeros(())}, []))
    with pytest.raises(KeyError, match="trajectory_key"):
        split_trajectories(_rollout(torch.zeros(3, dtype=torch.long)), trajectory_key="nope")
    with pytest.raises(KeyError, match="neither"):
        split_trajectories(TensorDict({"a": torch.zeros(3)}, [3]))
    bad = TensorDict({"a": torch.zeros(3), "traj_ids": torch.zeros(3, 2, dtype=torch.long)}, [3])
    with pytest.raises(ValueError, match="one id per step"):
        split_trajectories(bad)


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 3), data=st.data())
def test_property_roundtrip(rows: int, data: st.DataObject) -> None:
    """Each padded row is one run of equal ids, in order, and the mask recovers the rollout."""
    T = data.draw(st.integers(1, 12))
    lengths_per_row = [data.draw(st.lists(st.integers(1, 5), min_size=1, max_size=T))
                       for _ in range(rows)]
    ids = torch.zeros(rows, T, dtype=torch.long)
    expected = []
    next_id = 0
    for r, lens in enumerate(lengths_per_row):
        t = 0
        for length in lens:
            if t >= T:
                break
            length = min(length, T - t)
            ids[r, t: t + length] = next_id
            expected.append(length)
            next_id += 1
            t += length
        if t < T:
            ids[r, t:] = next_id
            expected.append(T - t)
            next_id += 1
    rollout = _rollout(ids)
    out = split_trajectories(rollout)
    mask = out["collector", "mask"]
    assert mask.sum(-1).tolist() == expected
    assert (out["obs"][mask] == rollout["obs"].reshape(-1)).all()
    assert (out["obs"][~mask] == 0).all()
    row_ids = out["collector", "traj_ids"]
    assert (row_ids[:, :1].expand_as(row_ids)[mask] == row_ids[mask]).all()
