"""DQN pieces for the demo: CartPole collector, Q-network, loss, target update, evaluation.

Each piece plugs into :class:`tdreplay.trainers.Trainer`: the collector is the trainer's data
source, the loss is its ``loss_module``, and the target update, epsilon schedule and evaluation
are hooks registered at ``pre_optim_steps`` / ``post_steps_log`` and saved with the trainer.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn
from torch.nn import functional as F

from tdreplay.trainers import Trainer, TrainerHookBase

ENV_ID = "CartPole-v1"


def make_qnet(hidden: int = 128, obs_dim: int = 4, n_actions: int = 2) -> nn.Module:
    """A two-hidden-layer MLP mapping observations to one Q-value per action."""
    return nn.Sequential(
        nn.Linear(obs_dim, hidden), nn.ReLU(),
        nn.Linear(hidden, hidden), nn.ReLU(),
        nn.Linear(hidden, n_actions),
    )


class EpsilonGreedyCollector:
    """Steps ``num_envs`` CartPole environments with an epsilon-greedy policy over ``qnet``.

    Each iteration yields one TensorDict of shape ``[num_envs, steps_per_env]`` (fewer steps
    when :attr:`stop_at` ends the batch sooner) with ``observation``, ``action``,
    ``("next", "observation")``, ``("next", "reward")``, ``("next", "terminated")``,
    ``("next", "done")`` and ``("collector", "mask")`` (the frames collected). Epsilon decays
    linearly from ``eps_start`` to ``eps_end`` over ``eps_decay_frames`` frames; the first
    ``init_random_frames`` frames are uniformly random (and the trainer does no optimisation
    step before them).

    ``state_dict`` holds the frame count (so epsilon continues after a resume), the recent
    training-episode returns and the random generator; the environments themselves start new
    episodes after a resume.
    """

    def __init__(
        self,
        qnet: nn.Module,
        *,
        num_envs: int = 4,
        frames_per_batch: int = 32,
        init_random_frames: int = 1000,
        eps_start: float = 1.0,
        eps_end: float = 0.05,
        eps_decay_frames: int = 10_000,
        seed: int = 0,
    ) -> None:
        if frames_per_batch % num_envs:
            raise ValueError(f"frames_per_batch ({frames_per_batch}) must be a multiple of "
                             f"num_envs ({num_envs}).")
        self.qnet = qnet
        self.num_envs = num_envs
        self.steps_per_env = frames_per_batch // num_envs
        self.init_random_frames = init_random_frames
        self.eps_start, self.eps_end, self.eps_decay_frames = eps_start, eps_end, eps_decay_frames
        self.frames = 0
        #: called before each batch: the frame count the batch must not go past (the next
        #: evaluation, the end of the run), or None; batches then end exactly there
        self.stop_at: Callable[[], int | None] | None = None
        self.recent_returns: list[float] = []
        self._envs = [gym.make(ENV_ID) for _ in range(num_envs)]
        self._generator = torch.Generator()
        self.set_seed(seed)

    def set_seed(self, seed: int) -> None:
        """Seed the action noise and the environments (their next reset)."""
        self._seed = seed
        self._generator.manual_seed(seed)
        self._obs: np.ndarray | None = None
        self._ep_return = np.zeros(self.num_envs)

    @property
    def epsilon(self) -> float:
        if self.frames < self.init_random_frames:
            return 1.0
        progress = min(1.0, self.frames / self.eps_decay_frames)
        return self.eps_start + progress * (self.eps_end - self.eps_start)

    def _reset_all(self) -> np.ndarray:
        # new seeds per (re)start: derived from the seed and the frame count, so a resumed run
        # does not replay the episodes it has already seen
        base = self._seed * 1_000_003 + self.frames
        return np.stack([env.reset(seed=base + i)[0] for i, env in enumerate(self._envs)])

    @torch.no_grad()
    def _act(self, obs: np.ndarray) -> np.ndarray:
        n = self.num_envs
        greedy = self.qnet(torch.as_tensor(obs, dtype=torch.float32)).argmax(-1)
        explore = torch.rand(n, generator=self._generator) < self.epsilon
        random_actions = torch.randint(0, 2, (n,), generator=self._generator)
        return torch.where(explore, random_actions, greedy).numpy()

    def __iter__(self) -> Iterator[TensorDictBase]:
        while True:
            yield self.collect()

    def collect(self) -> TensorDictBase:
        """Step the environments side by side and return the transitions.

        ``num_envs * steps_per_env`` frames, or fewer when :attr:`stop_at` says the batch must
        end sooner: then only the first environments take the last step, and the mask
        (``("collector", "mask")``) marks the frames that were not collected.
        """
        n = self.num_envs
        budget = n * self.steps_per_env
        stop = self.stop_at() if self.stop_at is not None else None
        if stop is not None and stop > self.frames:
            budget = min(budget, stop - self.frames)
        t = -(-budget // n)
        last_column = budget - (t - 1) * n  # environments stepping in the last column
        if self._obs is None:
            self._obs = self._reset_all()
        obs = np.zeros((n, t, 4), np.float32)
        next_obs = np.zeros((n, t, 4), np.float32)
        action = np.zeros((n, t), np.int64)
        reward = np.zeros((n, t), np.float32)
        terminated = np.zeros((n, t), bool)
        done = np.zeros((n, t), bool)
        mask = np.ones((n, t), bool)
        mask[last_column:, t - 1] = False
        for step in range(t):
            stepping = n if step < t - 1 else last_column
            obs[:, step] = self._obs
            acts = self._act(self._obs)
            for i, env in enumerate(self._envs[:stepping]):
                o, r, term, trunc, _ = env.step(int(acts[i]))
                action[i, step], reward[i, step] = acts[i], r
                next_obs[i, step], terminated[i, step], done[i, step] = o, term, term or trunc
                self._ep_return[i] += r
                if term or trunc:
                    self.recent_returns = (self.recent_returns + [float(self._ep_return[i])])[-20:]
                    self._ep_return[i] = 0.0
                    o, _ = env.reset(seed=int(torch.randint(0, 2**31 - 1, (),
                                                            generator=self._generator)))
                self._obs[i] = o
            self.frames += stepping
        return TensorDict(
            {
                "observation": torch.from_numpy(obs),
                "action": torch.from_numpy(action),
                "next": {
                    "observation": torch.from_numpy(next_obs),
                    "reward": torch.from_numpy(reward),
                    "terminated": torch.from_numpy(terminated),
                    "done": torch.from_numpy(done),
                },
                "collector": {"mask": torch.from_numpy(mask)},
            },
            batch_size=[n, t],
        )

    def state_dict(self) -> dict[str, Any]:
        return {"frames": self.frames, "recent_returns": list(self.recent_returns),
                "seed": self._seed, "generator": self._generator.get_state()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.frames = int(state_dict["frames"])
        self.recent_returns = list(state_dict["recent_returns"])
        self._seed = int(state_dict["seed"])
        self._generator.set_state(state_dict["generator"])
        self._obs = None  # environments start fresh episodes
        self._ep_return = np.zeros(self.num_envs)


class DQNLoss(nn.Module):
    """Double-DQN loss with importance weights; returns ``loss_value`` and ``td_error``.

    ``loss_value`` is the mean over the batch of ``priority_weight * smooth_l1(Q, target)``
    (weights of 1 when the batch has no ``priority_weight``, i.e. uniform sampling);
    ``td_error`` is ``|Q - target|`` per sample, the new priorities.
    """

    def __init__(self, qnet: nn.Module, gamma: float = 0.99) -> None:
        super().__init__()
        self.value_network = qnet
        self.target_value_network = copy.deepcopy(qnet).requires_grad_(False)
        self.gamma = gamma

    def forward(self, batch: TensorDictBase) -> TensorDictBase:
        obs, action = batch["observation"], batch["action"]
        next_obs = batch["next", "observation"]
        # one online pass over observations and next observations (double DQN picks the next
        # action with the online network and values it with the target network)
        q_all, next_q_online = self.value_network(torch.cat([obs, next_obs])).split(len(obs))
        q = q_all.gather(-1, action.unsqueeze(-1)).squeeze(-1)
        with torch.no_grad():
            next_action = next_q_online.argmax(-1, keepdim=True)
            next_q = self.target_value_network(next_obs).gather(-1, next_action).squeeze(-1)
            not_terminal = (~batch["next", "terminated"]).float()
            target = batch["next", "reward"] + self.gamma * not_terminal * next_q
        weight = batch.get("priority_weight", None)
        elementwise = F.smooth_l1_loss(q, target, reduction="none")
        if weight is not None:
            elementwise = elementwise * weight.to(elementwise.dtype)
        return TensorDict(
            {"loss_value": elementwise.mean(), "td_error": (q - target).detach().abs()},
            batch_size=[],
        )


class HardUpdate(TrainerHookBase):
    """``pre_optim_steps`` op: copy the online network into the target network, so each round
    of optimisation steps regresses towards a frozen snapshot (taken after the last round)."""

    def __init__(self, loss: DQNLoss) -> None:
        self.loss = loss

    @torch.no_grad()
    def __call__(self) -> None:
        self.loss.target_value_network.load_state_dict(self.loss.value_network.state_dict())

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        pass

    def register(self, trainer: Trainer, name: str = "target_update") -> None:
        trainer.register_op("pre_optim_steps", self)
        trainer.register_module(name, self)


def evaluate(qnet: nn.Module, episodes: int, seed: int) -> float:
    """Mean return of the greedy policy over ``episodes`` CartPole episodes (run side by side)."""
    envs = [gym.make(ENV_ID) for _ in range(episodes)]
    obs = np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(envs)])
    returns = np.zeros(episodes)
    alive = np.ones(episodes, bool)
    with torch.no_grad():
        while alive.any():
            actions = qnet(torch.as_tensor(obs, dtype=torch.float32)).argmax(-1).numpy()
            for i in np.flatnonzero(alive):
                o, r, term, trunc, _ = envs[i].step(int(actions[i]))
                obs[i] = o
                returns[i] += r
                alive[i] = not (term or trunc)
    return float(returns.mean())


class Evaluator(TrainerHookBase):
    """``post_steps_log`` op: every ``interval`` frames and after the last batch, evaluate the
    greedy policy and log
    ``eval_return`` (shown on the progress bar and printed). The history of
    ``(frames, eval_return)`` is saved with the trainer, so a resumed run plots it all."""

    def __init__(self, qnet: nn.Module, *, interval: int, episodes: int = 5,
                 seed: int = 10_000) -> None:
        self.qnet, self.interval, self.episodes, self.seed = qnet, interval, episodes, seed
        self.history: list[tuple[int, float]] = []
        self._trainer: Trainer | None = None
        self._next = interval

    def __call__(self, batch: TensorDictBase) -> dict[str, Any] | None:
        frames = self._trainer.collected_frames
        total = self._trainer.total_frames
        last_batch = total is not None and frames >= total
        if frames < self._next and not last_batch:
            return None
        self._next = (frames // self.interval + 1) * self.interval
        return self.run(frames)

    def run(self, frames: int) -> dict[str, Any]:
        value = evaluate(self.qnet, self.episodes, self.seed + len(self.history) * self.episodes)
        self.history.append((frames, value))
        self._trainer.write(f"frames {frames:>7d}  eval return {value:6.1f}")
        return {"eval_return": value, "log_pbar": True}

    @property
    def next_at(self) -> int:
        """The frame count of the next evaluation."""
        return self._next

    @property
    def best(self) -> float:
        return max((v for _, v in self.history), default=-math.inf)

    def state_dict(self) -> dict[str, Any]:
        return {"history": [list(h) for h in self.history], "next": self._next}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = [(int(f), float(v)) for f, v in state_dict["history"]]
        self._next = int(state_dict["next"])

    def register(self, trainer: Trainer, name: str = "evaluator") -> None:
        self._trainer = trainer
        trainer.register_op("post_steps_log", self)
        trainer.register_module(name, self)


class AnnealBeta:
    """``post_steps`` op: raise the prioritized sampler's importance exponent ``beta`` from its
    initial value to 1 over the first ``frames`` frames (the PER paper's schedule)."""

    def __init__(self, trainer: Trainer, sampler: Any, frames: int) -> None:
        self.trainer, self.sampler, self.frames = trainer, sampler, frames
        self.start = sampler.beta

    def __call__(self) -> None:
        progress = min(1.0, self.trainer.collected_frames / self.frames)
        self.sampler.beta = self.start + progress * (1.0 - self.start)


class TrainingReturnLog:
    """``pre_steps_log`` op: log the mean return of the last training episodes and epsilon."""

    def __init__(self, collector: EpsilonGreedyCollector) -> None:
        self.collector = collector

    def __call__(self, batch: TensorDictBase) -> dict[str, Any] | None:
        recent = self.collector.recent_returns
        if not recent:
            return None
        return {"train_return": float(np.mean(recent[-10:])),
                "epsilon": round(self.collector.epsilon, 3), "log_pbar": True}


class ReplayRatio:
    """``batch_process`` op: ``optim_steps_per_batch`` follows the batch's frame count, so a
    short batch (one that ends at an evaluation or at the end of the run) gets proportionally
    fewer optimisation steps: ``steps_per_frame`` optimisation steps per collected frame."""

    def __init__(self, trainer: Trainer, steps_per_frame: float) -> None:
        self.trainer, self.steps_per_frame = trainer, steps_per_frame

    def __call__(self, batch: TensorDictBase) -> None:
        mask = batch.get(("collector", "mask"), None)
        frames = int(mask.sum()) if mask is not None else batch.numel()
        self.trainer.optim_steps_per_batch = max(1, round(frames * self.steps_per_frame))
