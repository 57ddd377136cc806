"""``MultiStep``: n-step discounted returns and n-step-ahead next states, vectorised."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict import TensorDictBase

from tdreplay.core import Transform
from tdreplay.core.transform import NestedKey

from ._utils import (
    gather_time,
    keys_arg,
    prefix_next,
    require_tensordict,
    time_flags,
    trajectory_ends,
)


def _original_name(key: NestedKey) -> NestedKey:
    """Where the single-step reward is kept: ``"reward"`` -> ``"original_reward"``."""
    if isinstance(key, str):
        return f"original_{key}"
    return (*key[:-1], f"original_{key[-1]}")


class MultiStep(Transform):
    """Rewrites each step ``t`` as an n-step transition.

    The data has time as its last batch dimension, ``[..., T]``: a collected batch, or a sampled
    trajectory slice (``[B, T]``, or the flat batch of a slice sampler, whose slices end with a
    done/truncated flag). A trajectory ends where any of the ``done_keys`` entries under
    ``"next"`` is set, and at the end of the time dimension.

    For each step ``t``, the window covers ``m = min(n_steps, steps left in its trajectory)``
    steps ``t, ..., t + m - 1``, and the transform writes:

    - ``("next", reward_key)``: ``sum_{k < m} gamma**k * reward[t + k]`` (the single-step reward
      moves to ``("next", "original_reward")``);
    - every other ``"next"`` entry (next observation, ``done``, ``terminated``, ``truncated``,
      ...) taken from step ``t + m - 1``, i.e. the state ``m`` steps ahead and whether the
      episode terminated within the window;
    - ``"steps_to_next_obs"``: ``m`` (int64), and ``"gamma"``: ``gamma ** m``, the discount
      to apply to the value of the n-step-ahead state. As TorchRL's, both have the batch
      shape (``[..., T]``) when the done entry does, or has it followed by a singleton
      (``[..., T, 1]``); otherwise (one flag per agent, ``[..., T, n_agents]``) the done
      entry's shape.

    A loss then bootstraps with ``reward + gamma * (1 - terminated) * V(next_state)``.
    Root entries (observation, action) are left as they are. With ``n_steps=1`` only
    ``steps_to_next_obs``, ``gamma`` and ``original_reward`` are added.

    Unlike TorchRL's ``MultiStep``, the ``"next"`` done flags are also taken from the end of the
    window (TorchRL keeps the flags of step ``t``, so a termination inside the window is not
    seen by the loss); TorchRL's ``nonterminal`` entry is not written (use ``("next",
    "terminated")``).

    All steps are computed at once (a loop over the ``n_steps`` window offsets only), so the
    transform runs in a buffer's sample path or, appended with ``invert=True``, on every extend.

    Since it rewrites the ``"next"`` done flags, transforms that find trajectory boundaries from
    them (``CatFrames``) must run before it. A flat sample of several slices is handled:
    ``TensorDictReplayBuffer`` writes a ``SliceSampler``'s slice-end flags into the sample
    *before* the buffer's transforms, so n-step windows stop at slice ends.

    Parameters
    ----------
    gamma : float
        Discount factor in ``(0, 1]``.
    n_steps : int
        Number of rewards summed (>= 1).
    reward_keys : sequence of nested keys
        Rewards under ``"next"``. Defaults to ``("reward",)``.
    done_keys : sequence of nested keys
        Trajectory-end flags under ``"next"``; those present are OR-ed. Defaults to
        ``("done", "terminated", "truncated")``.

    Examples
    --------
    >>> import torch
    >>> from tensordict import TensorDict
    >>> td = TensorDict({
    ...     "obs": torch.arange(5.),
    ...     ("next", "obs"): torch.arange(1., 6.),
    ...     ("next", "reward"): torch.ones(5),
    ...     ("next", "done"): torch.tensor([False, False, True, False, False]),
    ... }, [5])
    >>> out = MultiStep(gamma=0.5, n_steps=2)(td)
    >>> out["next", "reward"]
    tensor([1.5000, 1.5000, 1.0000, 1.5000, 1.0000])
    >>> out["next", "obs"], out["steps_to_next_obs"]
    (tensor([2., 3., 3., 5., 5.]), tensor([2, 2, 1, 2, 1]))
    >>> out["gamma"]
    tensor([0.2500, 0.2500, 0.5000, 0.2500, 0.5000])
    >>> out["next", "done"]
    tensor([False,  True,  True, False, False])
    """

    def __init__(
        self,
        gamma: float,
        n_steps: int,
        *,
        reward_keys: Sequence[NestedKey] | NestedKey = ("reward",),
        done_keys: Sequence[NestedKey] | NestedKey = ("done", "terminated", "truncated"),
    ) -> None:
        if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or not 0 < gamma <= 1:
            raise ValueError(f"MultiStep: gamma must be a float in (0, 1], got {gamma!r}.")
        if not isinstance(n_steps, int) or isinstance(n_steps, bool) or n_steps < 1:
            raise ValueError(f"MultiStep: n_steps must be a positive int, got {n_steps!r}.")
        super().__init__()
        # a bare tuple of str is a list of keys here, as in TorchRL's ("done", "terminated", ...)
        if isinstance(reward_keys, tuple):
            reward_keys = list(reward_keys)
        if isinstance(done_keys, tuple):
            done_keys = list(done_keys)
        self.reward_keys = keys_arg(reward_keys, "reward_keys")
        self.done_keys = keys_arg(done_keys, "done_keys")
        if not self.reward_keys or not self.done_keys:
            raise ValueError("MultiStep needs at least one reward key and one done key.")
        self.gamma = float(gamma)
        self.n_steps = n_steps
        self.in_keys = [prefix_next(k) for k in self.reward_keys]
        self.out_keys = list(self.in_keys)

    def forward(self, data: TensorDictBase) -> TensorDictBase:
        require_tensordict(self, data)
        done_entries = [prefix_next(k) for k in self.done_keys]
        last = time_flags(self, data, done_entries)  # validates shapes, needs one done entry
        rewards = [self.read_entry(data, key) for key in self.in_keys]
        batch_dims = data.batch_dims
        for key, reward in zip(self.in_keys, rewards):
            if not isinstance(reward, torch.Tensor) or reward.shape[:batch_dims] != data.batch_size:
                shape = tuple(reward.shape) if isinstance(reward, torch.Tensor) else reward
                raise ValueError(f"MultiStep: reward entry {key!r} has shape {shape}; it must "
                                 f"start with the batch shape {tuple(data.batch_size)}.")
        T = data.batch_size[-1]
        t = torch.arange(T, device=last.device)
        window_end = torch.minimum(trajectory_ends(last), t + (self.n_steps - 1))
        steps = window_end - t + 1  # [*batch, T], in 1..n_steps

        discounted = [self._discount(reward, steps, batch_dims) for reward in rewards]

        next_td = data.get("next")
        ahead = next_td.exclude(*self.reward_keys)
        ahead = ahead.apply(lambda x: gather_time(x, window_end, batch_dims),
                            batch_size=data.batch_size)

        done_shape = next(data.get(k) for k in done_entries if data.get(k, None) is not None).shape
        if done_shape == (*data.batch_size, 1):  # TorchRL squeezes a trailing singleton
            done_shape = data.batch_size
        extra = (1,) * (len(done_shape) - batch_dims)
        for key in ahead.keys(True, True):
            data.set(("next", key) if isinstance(key, str) else ("next", *key), ahead.get(key))
        for key, reward, total in zip(self.in_keys, rewards, discounted):
            data.set(_original_name(key), reward)
            data.set(key, total)
        # one per done flag (the window is the same for every agent's flag: see time_flags)
        data.set("steps_to_next_obs",
                 steps.reshape(steps.shape + extra).expand(done_shape).contiguous())
        dtype = discounted[0].dtype
        gamma = torch.pow(torch.tensor(self.gamma, dtype=dtype, device=steps.device), steps)
        data.set("gamma", gamma.reshape(steps.shape + extra).expand(done_shape).contiguous())
        return data

    def _discount(self, reward: torch.Tensor, steps: torch.Tensor, batch_dims: int
                  ) -> torch.Tensor:
        """``sum_{k < steps[t]} gamma**k * reward[t + k]`` along the time dim."""
        time_axis = batch_dims - 1
        reward = reward if reward.is_floating_point() else reward.to(torch.get_default_dtype())
        T = reward.shape[time_axis]
        pad_shape = list(reward.shape)
        pad_shape[time_axis] = self.n_steps - 1
        padded = torch.cat([reward, reward.new_zeros(pad_shape)], time_axis)
        steps = steps.to(reward.device).reshape(steps.shape + (1,) * (reward.ndim - batch_dims))
        total = torch.zeros_like(reward)
        for k in range(self.n_steps):
            term = padded.narrow(time_axis, k, T) * (self.gamma ** k)
            total = total + torch.where(steps > k, term, torch.zeros_like(term))
        return total

    def __repr__(self) -> str:
        return f"MultiStep(gamma={self.gamma}, n_steps={self.n_steps})"
