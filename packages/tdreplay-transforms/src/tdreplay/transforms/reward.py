"""Transforms of the reward entries: ``RewardScaling``, ``RewardClipping``, ``BinarizeReward``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from tdreplay.core import Transform
from tdreplay.core.transform import NestedKey
from tdreplay.core.utils import check_flag

from ._state import affine_args, affine_map, as_tensor_arg, check_loc_scale, checked_state
from ._utils import keys_arg


def _reward_keys(in_keys: Any, out_keys: Any) -> tuple[list[NestedKey], list[NestedKey] | None]:
    in_keys = ["reward"] if in_keys is None else in_keys
    return (keys_arg(in_keys, "in_keys"),
            None if out_keys is None else keys_arg(out_keys, "out_keys"))


class RewardScaling(Transform):
    """Affine map of the reward on sample: ``reward * scale + loc``.

    With ``standard_normal=True`` it is ``(reward - loc) / scale`` instead. ``loc``, ``scale``
    and ``standard_normal`` are the transform's state (:meth:`state_dict`).

    Parameters
    ----------
    loc, scale : number or tensor
        The affine map; ``scale`` is clamped to at least ``1e-6``.
    in_keys, out_keys : sequence of nested keys
        Entries mapped. Defaults to ``["reward"]``; ``out_keys`` defaults to ``in_keys``.
    standard_normal : bool
        Standardise (``(reward - loc) / scale``) instead.

    Examples
    --------
    >>> import torch
    >>> from tensordict import TensorDict
    >>> td = TensorDict({"reward": torch.tensor([[1.0], [3.0]])}, [2])
    >>> RewardScaling(loc=1.0, scale=2.0)(td)["reward"].squeeze(-1)
    tensor([3., 7.])
    """

    def __init__(
        self,
        loc: float | torch.Tensor,
        scale: float | torch.Tensor,
        in_keys: Sequence[NestedKey] | NestedKey | None = None,
        out_keys: Sequence[NestedKey] | NestedKey | None = None,
        standard_normal: bool = False,
    ) -> None:
        super().__init__(*_reward_keys(in_keys, out_keys))
        loc_t, scale_t = affine_args(self, loc, scale)
        self.loc, self.scale = loc_t, scale_t.clamp_min(1e-6)
        self.standard_normal = check_flag(standard_normal, "RewardScaling: standard_normal")

    def _apply_transform(self, reward: torch.Tensor) -> torch.Tensor:
        return affine_map(self, reward, self.loc, self.scale, normalise=self.standard_normal)

    #: ``loc`` / ``scale`` are saved with the buffer's ``state_dict`` / ``dumps``
    has_state = True

    def state_dict(self) -> dict[str, torch.Tensor]:
        """``loc``, ``scale`` and ``standard_normal`` (TorchRL's keys)."""
        return {"loc": self.loc.clone(), "scale": self.scale.clone(),
                "standard_normal": torch.tensor(self.standard_normal)}

    def check_state_dict(self, state_dict: Any) -> None:
        """Refuse (``TypeError`` / ``KeyError`` naming the field) a state other than ``loc``,
        ``scale``, ``standard_normal`` tensors, and (``ValueError``) one whose
        ``standard_normal`` is not one value or whose ``loc`` / ``scale`` are not finite, do
        not broadcast together or differ in shape from the ``loc`` / ``scale`` held
        (as TorchRL's); changes nothing."""
        check_loc_scale(self, checked_state(self, state_dict, ("loc", "scale", "standard_normal")))

    def load_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Restore what :meth:`state_dict` returned (checked before anything changes)."""
        self.check_state_dict(state_dict)
        self.loc, self.scale = state_dict["loc"].clone(), state_dict["scale"].clone()
        self.standard_normal = bool(state_dict["standard_normal"])

    def __repr__(self) -> str:
        return (f"RewardScaling(loc={self.loc.tolist()}, scale={self.scale.tolist()}, "
                f"keys={self.in_keys})")


class RewardClipping(Transform):
    """Clamps the reward to ``[clamp_min, clamp_max]`` on sample (a bound left ``None`` is open).

    Parameters
    ----------
    clamp_min, clamp_max : number or tensor, optional
        The bounds; at least one is given, and ``clamp_min <= clamp_max``.
    in_keys, out_keys : sequence of nested keys
        Entries clamped. Defaults to ``["reward"]``; ``out_keys`` defaults to ``in_keys``.

    Examples
    --------
    >>> import torch
    >>> from tensordict import TensorDict
    >>> td = TensorDict({"reward": torch.tensor([[-5.0], [0.5], [5.0]])}, [3])
    >>> RewardClipping(clamp_min=-1.0, clamp_max=1.0)(td)["reward"].squeeze(-1)
    tensor([-1.0000,  0.5000,  1.0000])
    """

    def __init__(
        self,
        clamp_min: float | torch.Tensor | None = None,
        clamp_max: float | torch.Tensor | None = None,
        in_keys: Sequence[NestedKey] | NestedKey | None = None,
        out_keys: Sequence[NestedKey] | NestedKey | None = None,
    ) -> None:
        if clamp_min is None and clamp_max is None:
            raise ValueError("RewardClipping needs clamp_min or clamp_max (or both).")
        super().__init__(*_reward_keys(in_keys, out_keys))
        self.clamp_min = None if clamp_min is None else self._bound(clamp_min, "clamp_min")
        self.clamp_max = None if clamp_max is None else self._bound(clamp_max, "clamp_max")
        if self.clamp_min is not None and self.clamp_max is not None \
                and bool((self.clamp_min > self.clamp_max).any()):
            raise ValueError(f"RewardClipping: clamp_min={clamp_min} is larger than "
                             f"clamp_max={clamp_max}.")

    def _bound(self, value: Any, name: str) -> torch.Tensor:
        """A bound as a tensor of its own kind, as TorchRL's ``torch.as_tensor``: an int bound
        keeps an integer reward integer, a float one makes it float (``clamp``'s promotion)."""
        if isinstance(value, int) and not isinstance(value, bool):
            return torch.tensor(value)
        return as_tensor_arg(self, value, name)

    def _apply_transform(self, reward: torch.Tensor) -> torch.Tensor:
        # (the dtype of torch's type promotion, as TorchRL's: RewardClipping(-1.5, 1.5) of an
        # integer reward gives floats clipped at +-1.5, not integers clipped at +-1)
        return reward.clamp(self.clamp_min, self.clamp_max)

    def __repr__(self) -> str:
        def show(x: torch.Tensor | None) -> Any:
            return None if x is None else x.tolist()
        return (f"RewardClipping(clamp_min={show(self.clamp_min)}, "
                f"clamp_max={show(self.clamp_max)}, keys={self.in_keys})")


class BinarizeReward(Transform):
    """Maps the reward to ``1`` where it is positive, ``0`` elsewhere (``torch.int8``), on sample.

    The last dimension of the reward must be a singleton (``[..., 1]``), as in TorchRL;
    another shape raises a ``RuntimeError``.

    Parameters
    ----------
    in_keys, out_keys : sequence of nested keys
        Entries mapped. Defaults to ``["reward"]``; ``out_keys`` defaults to ``in_keys``.

    Examples
    --------
    >>> import torch
    >>> from tensordict import TensorDict
    >>> td = TensorDict({"reward": torch.tensor([[-1.0], [0.0], [2.0]])}, [3])
    >>> BinarizeReward()(td)["reward"].squeeze(-1)
    tensor([0, 0, 1], dtype=torch.int8)
    """

    def __init__(
        self,
        in_keys: Sequence[NestedKey] | NestedKey | None = None,
        out_keys: Sequence[NestedKey] | NestedKey | None = None,
    ) -> None:
        super().__init__(*_reward_keys(in_keys, out_keys))

    def _apply_transform(self, reward: torch.Tensor) -> torch.Tensor:
        if not reward.shape or reward.shape[-1] != 1:
            raise RuntimeError(f"BinarizeReward: the last dimension of the reward must be a "
                               f"singleton, got a reward of shape {tuple(reward.shape)}.")
        return (reward > 0).to(torch.int8)
