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


class HeldShapeError(ValueError, RuntimeError):
    """A loaded statistic of another shape than the one held: a ``ValueError``, and a
    ``RuntimeError`` as TorchRL's (torch's ``load_state_dict`` "size mismatch")."""


def check_loc_scale(owner: Any, state: Mapping[str, torch.Tensor]) -> None:
    """``ValueError`` naming the field unless the ``loc`` / ``scale`` / ``standard_normal``
    tensors of ``state`` (an affine transform's state, checked by :func:`checked_state`) can
    be used: a one-element ``standard_normal``, finite ``loc`` and ``scale`` (what
    ``init_stats_from`` makes) of shapes that broadcast together, and, where ``owner`` holds
    ``loc`` / ``scale`` tensors already, of their shapes (as torch's ``load_state_dict`` keeps
    the shape of a buffer it loads, and TorchRL's transforms with it: a ``loc`` of another shape
    broadcasts to other outputs, or fails at the next sample).

    Examples
    --------
    >>> class Norm: ...
    >>> state = {"loc": torch.zeros(3), "scale": torch.ones(3),
    ...          "standard_normal": torch.tensor(True)}
    >>> check_loc_scale(Norm(), state)
    >>> check_loc_scale(Norm(), {**state, "scale": torch.tensor([1.0, float("nan"), 1.0])})
    Traceback (most recent call last):
    ...
    ValueError: Norm.load_state_dict: state_dict['scale'] holds non-finite values.
    >>> held = Norm()
    >>> held.loc, held.scale = torch.zeros(3), torch.ones(3)
    >>> other_shape = {**state, "loc": torch.zeros(1), "scale": torch.ones(1)}
    >>> try:
    ...     check_loc_scale(held, other_shape)
    ... except RuntimeError as err:  # a ValueError too
    ...     print(err)
    Norm.load_state_dict: state_dict['loc'] has shape (1,), this Norm's loc (3,).
    """
    cls = type(owner).__name__
    flag = state["standard_normal"]
    if flag.numel() != 1:
        raise ValueError(f"{cls}.load_state_dict: state_dict['standard_normal'] must hold one "
                         f"value (a bool), got shape {tuple(flag.shape)}.")
    for name in ("loc", "scale"):
        value = state[name]
        if value.dtype is torch.bool or value.is_complex():
            raise ValueError(f"{cls}.load_state_dict: state_dict[{name!r}] must be real numbers, "
                             f"got {value.dtype}.")
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise ValueError(f"{cls}.load_state_dict: state_dict[{name!r}] holds non-finite "
                             "values.")
    try:
        torch.broadcast_shapes(state["loc"].shape, state["scale"].shape)
    except RuntimeError as err:
        raise ValueError(f"{cls}.load_state_dict: state_dict['loc'] of shape "
                         f"{tuple(state['loc'].shape)} and state_dict['scale'] of shape "
                         f"{tuple(state['scale'].shape)} do not broadcast together.") from err
    for name in ("loc", "scale"):
        held = getattr(owner, name, None)
        if isinstance(held, torch.Tensor) and state[name].shape != held.shape:
            raise HeldShapeError(f"{cls}.load_state_dict: state_dict[{name!r}] has shape "
                                 f"{tuple(state[name].shape)}, this {cls}'s {name} "
                                 f"{tuple(held.shape)}.")


def affine_args(owner: Any, loc: Any, scale: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``loc`` and ``scale`` given to an affine transform's constructor, as tensors:
    ``TypeError`` naming the argument for another type, ``ValueError`` for non-finite values or
    shapes that do not broadcast together (what :func:`check_loc_scale` refuses in a saved
    state: a transform built with them could save a checkpoint it cannot load back).

    Examples
    --------
    >>> class Norm: ...
    >>> affine_args(Norm(), 0.0, float("nan"))
    Traceback (most recent call last):
    ...
    ValueError: Norm: scale must be finite, got nan.
    """
    loc_t, scale_t = as_tensor_arg(owner, loc, "loc"), as_tensor_arg(owner, scale, "scale")
    for name, value in (("loc", loc_t), ("scale", scale_t)):
        if not bool(torch.isfinite(value).all()):
            shown = value.item() if value.numel() == 1 else "non-finite values"
            raise ValueError(f"{type(owner).__name__}: {name} must be finite, got {shown}.")
    try:
        torch.broadcast_shapes(loc_t.shape, scale_t.shape)
    except RuntimeError as err:
        raise ValueError(f"{type(owner).__name__}: loc of shape {tuple(loc_t.shape)} and scale "
                         f"of shape {tuple(scale_t.shape)} do not broadcast together.") from err
    return loc_t, scale_t


def affine_map(owner: Any, value: torch.Tensor, loc: torch.Tensor, scale: torch.Tensor, *,
               normalise: bool) -> torch.Tensor:
    """``(value - loc) / scale`` (``normalise``) or ``value * scale + loc``, of ``value``'s
    shape: ``ValueError`` naming ``owner`` when ``loc`` / ``scale`` would broadcast the entry
    to another shape (a ``[B, 1]`` reward scaled by a ``[5]`` scale became ``[B, 5]``).

    Examples
    --------
    >>> class Scaling: ...
    >>> affine_map(  # doctest: +ELLIPSIS
    ...     Scaling(), torch.ones(2, 1), torch.zeros(5), torch.ones(5), normalise=False)
    Traceback (most recent call last):
    ...
    ValueError: Scaling: loc (5,) and scale (5,) would turn an entry of shape (2, 1) into ...
    """
    out = (value - loc) / scale if normalise else value * scale + loc
    if out.shape != value.shape:
        raise ValueError(f"{type(owner).__name__}: loc {tuple(loc.shape)} and scale "
                         f"{tuple(scale.shape)} would turn an entry of shape "
                         f"{tuple(value.shape)} into {tuple(out.shape)}: they must broadcast "
                         "to the entry's shape.")
    return out


def as_tensor_arg(owner: Any, value: Any, name: str) -> torch.Tensor:
    """``value`` (a number or a tensor) as a tensor, a ``TypeError`` naming ``name`` otherwise."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{type(owner).__name__}: {name} must be a number or a tensor, got "
                        f"{value!r}.")
    return torch.tensor(float(value), dtype=torch.get_default_dtype())
