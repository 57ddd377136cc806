"""``Reward2GoTransform``: the discounted reward-to-go of each step, computed on extend."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from tensordict import TensorDictBase

from tdreplay.core import Transform
from tdreplay.core.transform import NestedKey
from tdreplay.core.utils import check_key

from ._utils import keys_arg, prefix_next, require_tensordict


def reward_to_go(reward: torch.Tensor, done: torch.Tensor, gamma: float) -> torch.Tensor:
    """``sum_{k=t}^{end} gamma**(k - t) * reward[k]`` along dim ``-2`` (time), where ``end`` is
    the first step at or after ``t`` whose ``done`` is set, or the last step.

    ``reward`` and ``done`` have the same shape ``[..., T, F]``; the result has ``reward``'s
    shape and a floating dtype (``reward``'s, or the default one for integer rewards).

    Examples
    --------
    >>> reward = torch.ones(6, 1)
    >>> done = torch.tensor([0, 0, 1, 0, 0, 0], dtype=torch.bool).unsqueeze(-1)
    >>> reward_to_go(reward, done, 0.5).squeeze(-1)
    tensor([1.7500, 1.5000, 1.0000, 1.7500, 1.5000, 1.0000])
    """
    if not reward.is_floating_point():
        reward = reward.to(torch.get_default_dtype())
    out = torch.empty_like(reward)
    going_on = ~done.to(torch.bool)
    running = torch.zeros_like(reward.select(-2, 0))
    for t in range(reward.shape[-2] - 1, -1, -1):  # from the last step back; a done step ends
        running = reward.select(-2, t) + gamma * running * going_on.select(-2, t)  # its sum
        out.select(-2, t).copy_(running)
    return out


class Reward2GoTransform(Transform):
    """Writes the discounted reward-to-go of every step when data is written to a buffer.

    An inverse (write-side) transform, as TorchRL's: on ``extend`` / ``add`` each entry of
    ``in_keys`` (default ``("next", "reward")``) gives ``out_keys`` (default: the same keys,
    overwritten) ``sum_{k=t}^{end} gamma ** (k - t) * reward[k]``, where ``end`` is the step whose
    ``("next", done_key)`` flag closes the episode, or the last step of the batch's time dim
    (an unfinished episode is cut there). Samples are left as stored.

    The time dim is the reward's second to last (rewards are ``[..., T, 1]``): a ``[T]``
    TensorDict is one run of steps, a ``[B, T]`` TensorDict ``B`` runs. Every run must hold
    at least one done flag (``RuntimeError`` otherwise, as TorchRL's: the reward-to-go of an
    episode is known only once it ended): write whole episodes.

    Parameters
    ----------
    gamma : float or tensor
        The discount factor, in ``[0, 1]``. Defaults to ``1.0``.
    in_keys, out_keys : sequence of nested keys
        Rewards read, and where their reward-to-go goes. ``out_keys`` defaults to ``in_keys``.
    done_key : nested key
        The done flag, read under ``"next"``. Defaults to ``"done"``.

    The sum is exact (a reverse scan); TorchRL's drops the terms whose discount
    ``gamma ** k`` is below ``1e-7``, so values of episodes longer than ``log(1e-7) /
    log(gamma)`` steps differ by about that much.

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> from tdreplay.core import ReplayBuffer
    >>> from tdreplay.storages import LazyTensorStorage
    >>> r2g = Reward2GoTransform(gamma=0.5, out_keys=["reward_to_go"])
    >>> rb = ReplayBuffer(storage=LazyTensorStorage(10), transform=r2g)
    >>> done = torch.tensor([[0, 1, 0, 0, 1]], dtype=torch.bool).unsqueeze(-1)
    >>> td = TensorDict({"next": {"done": done, "reward": torch.ones(1, 5, 1)}}, [1, 5])
    >>> _ = rb.extend(td)
    >>> rb[0]["reward_to_go"].squeeze(-1)
    tensor([1.5000, 1.0000, 1.7500, 1.5000, 1.0000])
    """

    #: its work is on the write side, over whole episodes: inverted, it would compute
    #: rewards-to-go over each sampled batch as if its rows were one run (TorchRL refuses it)
    invertible = False

    def __init__(
        self,
        gamma: float | torch.Tensor = 1.0,
        in_keys: Sequence[NestedKey] | NestedKey | None = None,
        out_keys: Sequence[NestedKey] | NestedKey | None = None,
        done_key: NestedKey = "done",
    ) -> None:
        in_keys = keys_arg(("next", "reward") if in_keys is None else in_keys, "in_keys")
        out_keys = list(in_keys) if out_keys is None else keys_arg(out_keys, "out_keys")
        super().__init__(in_keys=in_keys, in_keys_inv=in_keys, out_keys_inv=out_keys)
        self.gamma = _checked_gamma(gamma)
        self.done_key = check_key(done_key, "done_key")

    def forward(self, data: TensorDictBase) -> TensorDictBase:
        """Samples are left as they are stored."""
        return data

    def inv(self, data: TensorDictBase) -> TensorDictBase:
        """A shallow copy of ``data`` with the reward-to-go of the ``in_keys`` it holds
        (``KeyError`` if it holds none, or lacks the done flag)."""
        data = require_tensordict(self, data)
        done = self.read_entry(data, prefix_next(self.done_key))
        if done.ndim < 2 or not bool(done.any(-2).all()):
            raise RuntimeError(
                f"Reward2GoTransform: a run of steps has no episode end in "
                f"{prefix_next(self.done_key)!r}: the reward-to-go is known once the episode "
                "ended; write whole episodes (a [T] or [B, T] batch whose every run ends).")
        present = [(i, o) for i, o in zip(self.in_keys_inv, self.out_keys_inv)
                   if data.get(i, None) is not None]
        if not present:
            raise KeyError(f"Reward2GoTransform: none of the reward entries {self.in_keys_inv} "
                           "is in the data.")
        results = [(out_key, self._of(data.get(in_key), done, in_key))
                   for in_key, out_key in present]  # (all computed before anything is set)
        data = data.copy()
        for out_key, value in results:
            data.set(out_key, value)
        return data

    def _of(self, reward: torch.Tensor, done: torch.Tensor, key: NestedKey) -> torch.Tensor:
        if reward.shape != done.shape:
            raise ValueError(f"Reward2GoTransform: reward {key!r} of shape {list(reward.shape)} "
                             f"and done {prefix_next(self.done_key)!r} of shape "
                             f"{list(done.shape)} must have the same shape.")
        return reward_to_go(reward, done, self.gamma)

    def __repr__(self) -> str:
        return (f"Reward2GoTransform(gamma={self.gamma}, in_keys={self.in_keys_inv}, "
                f"out_keys={self.out_keys_inv}, done_key={self.done_key!r})")


def _checked_gamma(gamma: object) -> float:
    """``gamma`` (a number or a one-element tensor) as a float in ``[0, 1]``."""
    if isinstance(gamma, torch.Tensor) and gamma.numel() == 1 and not gamma.is_complex():
        gamma = gamma.item()
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float)):
        raise TypeError(f"Reward2GoTransform: gamma must be a number, got {gamma!r}.")
    if not (math.isfinite(gamma) and 0.0 <= gamma <= 1.0):
        raise ValueError(f"Reward2GoTransform: gamma must be in [0, 1], got {gamma!r}.")
    return float(gamma)
