"""HERReplayBuffer over a ``LazyStackStorage`` (TensorDict rows kept as they are): it relabels
as over a ``LazyTensorStorage`` of the same steps, as TorchRL's does (it was refused: "its
LazyStackStorage holds no tensors")."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import HERReplayBuffer
from tdreplay.storages import LazyStackStorage, LazyTensorStorage


def _steps(n: int, done_at: tuple[int, ...]) -> TensorDict:
    done = torch.zeros(n, 1, dtype=torch.bool)
    done[list(done_at)] = True
    achieved = torch.arange(n, dtype=torch.float32)[:, None].expand(n, 2).clone()
    return TensorDict({"achieved_goal": achieved, "desired_goal": torch.full((n, 2), -1.0),
                       "next": {"reward": torch.zeros(n, 1), "done": done}}, [n])


def _relabelled(storage, strategy: str) -> tuple[list[int], list[float]]:
    rb = HERReplayBuffer(reward_fn=lambda td: td["achieved_goal"][:, :1].clone(),
                         storage=storage, batch_size=32, strategy=strategy, her_ratio=1.0,
                         generator=torch.Generator().manual_seed(0))
    rb.extend(_steps(12, done_at=(3, 8)))  # trajectories 0-3, 4-8, 9-11
    batch, info = rb.sample(return_info=True)
    return info["index"].tolist(), batch["desired_goal"][:, 0].tolist()


@pytest.mark.parametrize("strategy", ["final", "future", "episode"])
def test_stacked_rows_relabel_as_tensor_rows(strategy):
    slots, goals = _relabelled(LazyStackStorage(20), strategy)
    assert (slots, goals) == _relabelled(LazyTensorStorage(20), strategy)
    trajectory = [0] * 4 + [1] * 5 + [2] * 3
    for slot, goal in zip(slots, goals):
        assert trajectory[int(goal)] == trajectory[slot]  # a goal of the step's own trajectory
        if strategy != "episode":
            assert goal >= slot  # from the step or later
