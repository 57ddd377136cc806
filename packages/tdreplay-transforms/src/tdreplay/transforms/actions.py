"""Transforms of the action side: ``DiscreteActionProjection``, ``gSDENoise``."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict import TensorDictBase

from tdreplay.core import Transform
from tdreplay.core.transform import NestedKey
from tdreplay.core.utils import check_count, check_flag, check_key, check_required_count

from ._utils import require_tensordict


class DiscreteActionProjection(Transform):
    """Maps one-hot actions between ``num_actions_effective`` and ``max_actions`` choices.

    On extend (the write side), a one-hot action over ``max_actions`` becomes one over
    ``num_actions_effective``; an action beyond that range is replaced by one drawn uniformly
    among the effective actions (``torch``'s global generator). On sample, with
    ``include_forward=True``, a one-hot action is widened back to ``max_actions`` choices.
    Actions come back as ``torch.int64`` one-hot tensors.

    Parameters
    ----------
    num_actions_effective : int
        Number of actions actually available.
    max_actions : int
        Number of actions of the wide encoding (``>= num_actions_effective``).
    action_key : nested key
        The action entry. Defaults to ``"action"``.
    include_forward : bool
        Widen the action on sample too. Defaults to ``True``.

    Examples
    --------
    >>> import torch
    >>> from tensordict import TensorDict
    >>> t = DiscreteActionProjection(num_actions_effective=2, max_actions=3)
    >>> t.inv(TensorDict({"action": torch.tensor([[0, 1, 0]])}, [1]))["action"]
    tensor([[0, 1]])
    >>> t(TensorDict({"action": torch.tensor([[0, 1]])}, [1]))["action"]
    tensor([[0, 1, 0]])
    """

    def __init__(
        self,
        num_actions_effective: int,
        max_actions: int,
        action_key: NestedKey = "action",
        include_forward: bool = True,
    ) -> None:
        include_forward = check_flag(include_forward, "DiscreteActionProjection: include_forward")
        num_actions_effective = check_required_count(
            num_actions_effective, "DiscreteActionProjection: num_actions_effective", 1)
        max_actions = check_required_count(max_actions, "DiscreteActionProjection: max_actions", 1)
        if max_actions < num_actions_effective:
            raise RuntimeError(f"DiscreteActionProjection: max_actions={max_actions} must be at "
                               f"least num_actions_effective={num_actions_effective}.")
        key = check_key(action_key, "action_key")
        super().__init__(in_keys=[key] if include_forward else [], in_keys_inv=[key])
        self.num_actions_effective = num_actions_effective
        self.max_actions = max_actions

    def _apply_transform(self, action: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.one_hot(action.argmax(-1), self.max_actions)

    def _inv_apply_transform(self, action: torch.Tensor) -> torch.Tensor:
        if action.ndim == 0 or action.shape[-1] != self.max_actions:
            raise RuntimeError(f"DiscreteActionProjection: the action's last dimension must be "
                               f"max_actions={self.max_actions}, got shape "
                               f"{tuple(action.shape)}.")
        index = action.long().argmax(-1)
        beyond = index >= self.num_actions_effective
        if bool(beyond.any()):
            drawn = torch.randint(self.num_actions_effective, (int(beyond.sum()),),
                                  device=index.device)
            index = index.masked_scatter(beyond, drawn)
        return torch.nn.functional.one_hot(index, self.num_actions_effective)

    def __repr__(self) -> str:
        return (f"DiscreteActionProjection(num_actions_effective={self.num_actions_effective}, "
                f"max_actions={self.max_actions}, keys={self.in_keys_inv})")


class gSDENoise(Transform):  # noqa: N801 (TorchRL's name)
    """Writes the gSDE exploration-noise entry ``"_eps_gSDE"`` into every sample.

    The entry is what TorchRL's ``gSDEModule`` reads: zeros of shape ``[*batch, 1]`` (the module
    draws fresh noise when it sees zeros), or, with both ``state_dim`` and ``action_dim``,
    standard normal noise of shape ``[*batch, action_dim, state_dim]``.

    Parameters
    ----------
    state_dim, action_dim : int, optional
        Dimensions of the noise matrix (both or neither).
    shape : sequence of int, optional
        Batch shape of the entry; must be the sample's batch size. Defaults to it.

    Examples
    --------
    >>> import torch
    >>> from tensordict import TensorDict
    >>> gSDENoise(state_dim=3, action_dim=2)(TensorDict({}, [4]))["_eps_gSDE"].shape
    torch.Size([4, 2, 3])
    >>> gSDENoise()(TensorDict({}, [4]))["_eps_gSDE"].shape
    torch.Size([4, 1])
    """

    noise_key = "_eps_gSDE"

    def __init__(
        self,
        state_dim: int | None = None,
        action_dim: int | None = None,
        shape: Sequence[int] | None = None,
    ) -> None:
        super().__init__(out_keys=[])
        if (state_dim is None) != (action_dim is None):
            raise ValueError("gSDENoise: give both state_dim and action_dim, or neither.")
        self.state_dim = check_count(state_dim, "gSDENoise: state_dim", 1)
        self.action_dim = check_count(action_dim, "gSDENoise: action_dim", 1)
        self.shape = None if shape is None else torch.Size(shape)

    def forward(self, data: TensorDictBase) -> TensorDictBase:
        require_tensordict(self, data)
        batch = data.batch_size if self.shape is None else self.shape
        if batch != data.batch_size:
            raise RuntimeError(f"gSDENoise: shape={tuple(batch)} is not the batch size "
                               f"{tuple(data.batch_size)} of the data.")
        device = data.device if data.device is not None else torch.device("cpu")
        if self.state_dim is None or self.action_dim is None:
            noise = torch.zeros(*batch, 1, device=device)
        else:
            noise = torch.randn(*batch, self.action_dim, self.state_dim, device=device)
        data.set(self.noise_key, noise)
        return data

    def __repr__(self) -> str:
        return f"gSDENoise(state_dim={self.state_dim}, action_dim={self.action_dim})"
