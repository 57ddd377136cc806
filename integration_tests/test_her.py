"""Hindsight experience replay on the real storages, through the ``tdreplay.data`` facade.

An ``HERReplayBuffer`` over a ``LazyTensorStorage`` of vectorised rollouts (``ndim=2``: goals
stay in their environment's lane), over a ``LazyMemmapStorage`` saved with ``dumps`` and
restored, with a prioritized sampler and a read-side transform (which sees the relabelled
rewards), and from TorchRL's submodule path.
"""

from __future__ import annotations

import tempfile

import torch
from tensordict import TensorDict

from tdreplay.data import (
    HERReplayBuffer,
    HindsightStrategy,
    LazyMemmapStorage,
    LazyTensorStorage,
    PrioritizedSampler,
)

ENVS, T = 3, 4


def _rollout(done: list[list[int]]) -> TensorDict:
    """``[ENVS, T]`` steps; the achieved goal of env ``e`` at time ``t`` is ``10 * e + t``."""
    ids = (10 * torch.arange(ENVS)[:, None] + torch.arange(T)).float()[..., None]
    return TensorDict({
        "desired_goal": torch.full((ENVS, T, 1), -1.0), "achieved_goal": ids,
        "next": {"reward": torch.zeros(ENVS, T, 1),
                 "done": torch.tensor(done, dtype=torch.bool)[..., None]},
    }, [ENVS, T])


def _reached(td: TensorDict) -> torch.Tensor:
    return (td["achieved_goal"] == td["desired_goal"]).float()


def test_goals_stay_in_the_lane_of_a_time_major_storage():
    rb = HERReplayBuffer(reward_fn=_reached, storage=LazyTensorStorage(ENVS * T, ndim=2),
                         batch_size=128, her_ratio=1.0, strategy="final",
                         generator=torch.Generator().manual_seed(0))
    rb.extend(_rollout([[0, 1, 0, 1], [0, 0, 0, 1], [1, 0, 0, 0]]))
    assert rb.storage.shape == (T, ENVS)
    batch = rb.sample()
    achieved, goal = batch["achieved_goal"][:, 0], batch["desired_goal"][:, 0]
    final = {0: 1, 1: 1, 2: 3, 3: 3, 10: 13, 11: 13, 12: 13, 13: 13, 20: 20, 21: 23, 22: 23,
             23: 23}
    assert {(int(a), int(g)) for a, g in zip(achieved, goal)} <= {(a, g) for a, g in
                                                                  final.items()}
    assert batch["next", "reward"].shape == (128, 1)
    assert torch.equal(batch["next", "reward"][:, 0], (achieved == goal).float())


def test_memmap_buffer_restored_from_dumps_relabels_as_the_original():
    def make(strategy: str = "episode") -> HERReplayBuffer:
        return HERReplayBuffer(reward_fn=_reached, storage=LazyMemmapStorage(20),
                               batch_size=16, her_ratio=0.5, strategy=strategy,
                               generator=torch.Generator().manual_seed(1))

    rb = make()
    rb.extend(_rollout([[0, 1, 0, 1], [0, 0, 0, 1], [1, 0, 0, 1]]).reshape(-1))
    rb.strategy = HindsightStrategy.FUTURE
    rb.sample()
    with tempfile.TemporaryDirectory() as path:
        rb.dumps(path)
        other = make()
        other.loads(path)
        assert other.strategy is HindsightStrategy.EPISODE  # its own settings, as TorchRL's
        restored = make("future")
        restored.loads(path)
        for _ in range(3):
            a, b = rb.sample(), restored.sample()
            assert torch.equal(a["index"], b["index"])
            assert torch.equal(a["desired_goal"], b["desired_goal"])
            assert torch.equal(a["next", "reward"], b["next", "reward"])


def test_prioritized_sampler_and_transform_see_the_relabelled_batch():
    seen = []

    def scale(td: TensorDict) -> TensorDict:
        seen.append(td["next", "reward"].clone())
        td["next", "reward"] = td["next", "reward"] * 10
        return td

    rb = HERReplayBuffer(reward_fn=lambda td: torch.ones(td.batch_size[0]),
                         storage=LazyTensorStorage(12),
                         sampler=PrioritizedSampler(12, alpha=0.7, beta=0.5), batch_size=10,
                         her_ratio=0.5, transform=scale)
    rb.extend(_rollout([[0, 0, 0, 1]] * ENVS).reshape(-1))
    batch = rb.sample()
    assert seen[0][:5, 0].tolist() == [1.0] * 5 and seen[0][5:, 0].tolist() == [0.0] * 5
    assert batch["next", "reward"][:5, 0].tolist() == [10.0] * 5
    assert "priority_weight" in batch.keys()


def test_torchrl_submodule_path():
    from tdreplay.data.replay_buffers.her import HERReplayBuffer as Her
    from tdreplay.data.replay_buffers.her import HindsightStrategy as Strategy

    assert Her is HERReplayBuffer and Strategy is HindsightStrategy
