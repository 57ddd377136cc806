"""Checks for the ``state_dict`` / ``load_state_dict`` of the transforms that hold state."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch


def checked_state(owner: Any, state_dict: Any, names: Iterable[str]) -> dict[str, torch.Tensor]:
    """The tensors ``names`` of ``state_dict``, after checking that it holds exactly those.

    Raises a ``TypeError`` (not a mapping, a value not a tensor) or a ``KeyError`` (keys missing
    or unexpected) naming ``owner``'s class; nothing is changed on ``owner``.
    """
    cls = type(owner).__name__
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"{cls}.load_state_dict: state_dict must be a mapping, got "
                        f"{type(state_dict).__name__}.")
    wanted = set(names)
    missing = sorted(wanted - set(state_dict))
    unexpected = sorted(map(str, set(state_dict) - wanted))
    if missing or unexpected:
        raise KeyError(f"{cls}.load_state_dict: state_dict keys do not match: missing {missing}, "
                       f"unexpected {unexpected}.")
    out = {}
    for name in sorted(wanted):
        value = state_dict[name]
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{cls}.load_state_dict: state_dict[{name!r}] must be a tensor, got "
                            f"{type(value).__name__}.")
        out[name] = value
    return out


def as_tensor_arg(owner: Any, value: Any, name: str) -> torch.Tensor:
    """``value`` (a number or a tensor) as a tensor, a ``TypeError`` naming ``name`` otherwise."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{type(owner).__name__}: {name} must be a number or a tensor, got "
                        f"{value!r}.")
    return torch.tensor(float(value), dtype=torch.get_default_dtype())
