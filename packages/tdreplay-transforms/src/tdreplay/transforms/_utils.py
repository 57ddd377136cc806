"""Helpers shared by the transforms: input checks and trajectory geometry along the time dim."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from tensordict import TensorDictBase

from tdreplay.core.utils import NestedKey, ensure_tensordict, normalize_keys


def require_tensordict(transform: Any, data: Any) -> TensorDictBase:
    """Return ``data`` if it is a TensorDict, else raise a ``TypeError`` naming ``transform``."""
    return ensure_tensordict(data, f"the input of {type(transform).__name__}")


def keys_arg(keys: Any, name: str) -> list[NestedKey]:
    """Normalise a key or a sequence of keys (``None`` -> empty list)."""
    if keys is not None and not isinstance(keys, (str, tuple, Sequence)):
        raise TypeError(f"{name} must be a key or a sequence of keys, got {keys!r}.")
    return normalize_keys(keys, name)


def prefix_next(key: NestedKey) -> tuple[str, ...]:
    """``("next", *key)``."""
    return ("next", key) if isinstance(key, str) else ("next", *key)


def strip_next(key: NestedKey) -> NestedKey | None:
    """The root key of a ``("next", ...)`` key, ``None`` for any other key."""
    if isinstance(key, tuple) and len(key) > 1 and key[0] == "next":
        return key[1] if len(key) == 2 else key[1:]
    return None


def time_flags(transform: Any, data: TensorDictBase, keys: Sequence[NestedKey]) -> torch.Tensor:
    """OR of the boolean entries ``keys`` that are present, shaped like ``data.batch_size``.

    Each entry must have the batch shape of ``data``, optionally followed by trailing dimensions
    (a trailing ``[1]``, or one flag per agent), which are reduced with ``any``.
    """
    if data.batch_dims == 0:
        raise ValueError(f"{type(transform).__name__} needs data with a time dimension (the last "
                         "batch dimension), got a TensorDict with an empty batch_size.")
    flags = None
    for key in keys:
        value = data.get(key, None)
        if value is None:
            continue
        if not isinstance(value, torch.Tensor) or value.shape[: data.batch_dims] != data.batch_size:
            shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise ValueError(f"{type(transform).__name__}: entry {key!r} has shape {shape}; it "
                             f"must start with the batch shape {tuple(data.batch_size)}.")
        value = value.bool()
        if value.ndim > data.batch_dims:
            value = value.flatten(data.batch_dims).any(-1)
        flags = value if flags is None else flags | value
    if flags is None:
        raise KeyError(f"{type(transform).__name__} needs at least one of the entries "
                       f"{list(keys)} to find trajectory boundaries; none is in the data (present: "
                       f"{sorted(map(str, data.keys(True, True)))}).")
    return flags


def trajectory_starts(last: torch.Tensor) -> torch.Tensor:
    """For each step, the time index where its trajectory starts.

    ``last`` (bool, ``[..., T]``) marks the last step of each trajectory; step ``t`` starts a
    trajectory when ``t == 0`` or ``last[t - 1]``.
    """
    T = last.shape[-1]
    t = torch.arange(T, device=last.device).expand_as(last)
    starts = torch.ones_like(last)
    starts[..., 1:] = last[..., :-1]
    return torch.where(starts, t, torch.zeros_like(t)).cummax(-1).values


def trajectory_ends(last: torch.Tensor) -> torch.Tensor:
    """For each step, the time index of the last step of its trajectory (``T - 1`` at most)."""
    T = last.shape[-1]
    t = torch.arange(T, device=last.device).expand_as(last)
    ends = last.clone()
    ends[..., -1:] = True  # (a slice: no step at all is fine)
    return torch.where(ends, t, torch.full_like(t, T - 1)).flip(-1).cummin(-1).values.flip(-1)


def gather_time(x: torch.Tensor, index: torch.Tensor, batch_dims: int) -> torch.Tensor:
    """Pick time steps of ``x`` per batch element.

    ``x`` has shape ``[*batch, T, *feat]`` (``batch_dims = len(batch) + 1``); ``index`` holds time
    indices with shape ``[*batch, T, *extra]``. Returns ``[*batch, T, *extra, *feat]``.
    """
    batch = x.shape[: batch_dims - 1]
    T = x.shape[batch_dims - 1]
    feat = x.shape[batch_dims:]
    flat = math.prod(batch)
    index = index.to(x.device)
    offsets = torch.arange(flat, device=x.device).unsqueeze(1) * T
    flat_index = (index.reshape(flat, -1) + offsets).reshape(-1)
    # one index_select over [flat * T] rows (cheaper than 2-d advanced indexing)
    return x.reshape(flat * T, *feat).index_select(0, flat_index).reshape(*index.shape, *feat)
