"""Checks and conversions of priority values (pure functions over host or device tensors)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from tdreplay.core.priority_shapes import priority_for_index
from tdreplay.core.utils import as_long_tensor, check_flag

__all__ = ["CPU", "REDUCTIONS", "TINY", "HostPriority", "as_priority_tensor", "check_options",
           "check_priority_values", "check_real", "check_slots", "check_stored_priority",
           "flat_priority", "host_bounds", "host_priority", "leaf_limit", "leaf_values",
           "prepare_update", "reduce_priority", "shown_slots", "slots_on"]

#: Accepted ``reduction`` names.
REDUCTIONS = ("max", "min", "sum", "mean", "median")
#: Smallest normal float64: the least stored priority of a written slot.
TINY = float(np.finfo(np.float64).tiny)
_FLOAT64_MAX = float(np.finfo(np.float64).max)
#: The host device (priority values are checked there).
CPU = torch.device("cpu")


def check_real(value: Any, name: str, *, minimum: float = 0.0) -> float:
    """``value`` as a float; raise unless it is a finite real number ``>= minimum`` (a Python
    or numpy number, or a one-element real tensor, read once: TorchRL's tensor ``alpha``).

    Examples
    --------
    >>> check_real(1, "alpha")
    1.0
    >>> check_real(torch.tensor(0.5), "beta")
    0.5
    """
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.dtype == torch.bool or value.is_complex():
            raise TypeError(f"{name} must be a real number or a one-element real tensor, got a "
                            f"tensor of shape {tuple(value.shape)} and dtype {value.dtype}.")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}.")
    value = float(value)
    if not math.isfinite(value) or value < minimum:
        raise ValueError(f"{name} must be greater or equal to {minimum} (a finite number), got "
                         f"{value}.")
    return value


def as_priority_tensor(priority: Any) -> torch.Tensor:
    """``priority`` (number, array or tensor of real numbers) as a detached tensor."""
    if not isinstance(priority, torch.Tensor):
        if isinstance(priority, np.ndarray):
            if priority.dtype.kind not in "biuf":
                raise TypeError(f"priority must hold real numbers, got a numpy array of dtype "
                                f"{priority.dtype}.")
            priority = torch.from_numpy(priority)
        else:
            try:
                priority = torch.as_tensor(priority)
            except (TypeError, ValueError, RuntimeError) as err:
                raise TypeError(f"priority must be a number, an array or a tensor of real "
                                f"numbers, got {type(priority).__name__}.") from err
    if priority.dtype is torch.bool or priority.is_complex():
        raise TypeError(f"priority must hold real numbers, got dtype {priority.dtype}.")
    return priority.detach()


def check_priority_values(priority: torch.Tensor) -> None:
    """Raise ``ValueError`` unless every value of the host tensor ``priority`` is finite, >= 0."""
    if not priority.numel():
        return
    lo, hi = torch.aminmax(priority.reshape(-1))
    if not (float(lo) >= 0.0 and float(hi) < math.inf):
        bad = priority[~((priority >= 0) & (priority < math.inf))].reshape(-1)
        raise ValueError(f"priority must be finite and >= 0; got {bad[:5].tolist()}. "
                         "Nothing was updated.")


def reduce_priority(priority: torch.Tensor, n: int, reduction: str) -> torch.Tensor:
    """Reduce ``priority`` (``n`` items, each a value or a row of trailing values) to ``n``.

    Examples
    --------
    >>> reduce_priority(torch.tensor([[1.0, 3.0], [2.0, 0.0]]), 2, "max").tolist()
    [3.0, 2.0]
    """
    if priority.ndim <= 1:
        return priority
    if n == 0:  # (an empty batch: nothing to reduce)
        return priority.reshape(0)
    flat = priority.reshape(n, -1)
    if flat.shape[1] == 0:
        raise ValueError(f"priority of shape {tuple(priority.shape)} holds no value for its {n} "
                         "items: nothing to rank them by.")
    if flat.shape[1] == 1:
        return flat[:, 0]
    if reduction == "max":
        return flat.amax(1)
    if reduction == "min":
        return flat.amin(1)
    if reduction == "sum":
        return flat.sum(1)
    if reduction == "mean":
        return flat.mean(1)
    return flat.median(1).values


def flat_priority(index: torch.Tensor, priority: Any) -> torch.Tensor:
    """Priorities matching the flat ``index``: one per item, or ``[n, k]`` rows to reduce
    (shapes as :func:`tdreplay.core.priority_shapes.priority_for_index` lays them out)."""
    shaped = priority_for_index(as_priority_tensor(priority), index.shape)
    n = index.numel()
    return shaped.reshape(n) if shaped.ndim == index.ndim else shaped.reshape(n, -1)


def leaf_values(priority: torch.Tensor, alpha: float, eps: float) -> torch.Tensor:
    """Stored values of raw priorities: ``max((priority + eps) ** alpha, tiny)``.

    Examples
    --------
    >>> leaf_values(torch.tensor([0.0, 3.0], dtype=torch.float64), 1.0, 1.0).tolist()
    [1.0, 4.0]
    """
    return torch.pow(priority + eps, alpha).clamp_min_(TINY)


@dataclass(frozen=True, eq=False)
class HostPriority:
    """Priority values of ``n`` items as the numba update kernel takes them: host float64
    tensors of the values given (``raw``: one per item, or ``[n, k]``), one reduced value per
    item (``reduced``) and its stored value before the clamp to :data:`TINY` (``leaf``,
    ``(reduced + eps) ** alpha``), with the ``alpha``, ``eps`` and ``reduction`` they were
    computed with. Made once by :func:`host_priority`, they can be checked before a write and
    then applied after it without a second conversion.
    """

    raw: torch.Tensor
    reduced: torch.Tensor
    leaf: torch.Tensor
    alpha: float
    eps: float
    reduction: str

    def kernel_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(raw, reduced, leaf)`` as the numba kernels take them: flat numpy views, no
        copy (``reduced`` is ``raw`` when nothing was reduced)."""
        raw = self.raw if self.raw.ndim == 1 else self.raw.reshape(-1)  # a view: contiguous
        raw_np = raw.numpy()
        reduced_np = raw_np if self.reduced is self.raw else self.reduced.numpy()
        return raw_np, reduced_np, self.leaf.numpy()

    def fits(self, n: int, alpha: float, eps: float, reduction: str) -> bool:
        """Whether these are the values of an update of ``n`` items with these settings."""
        return (self.reduced.shape[0] == n and self.alpha == alpha and self.eps == eps
                and self.reduction == reduction)


def host_priority(priority: torch.Tensor, n: int, reduction: str, alpha: float,
                  eps: float) -> HostPriority:
    """The :class:`HostPriority` of ``priority`` (a tensor of real numbers: one per item of
    ``n``, a scalar for ``n == 1``, or one row per item to reduce with ``reduction``), unchecked.

    Examples
    --------
    >>> values = host_priority(torch.tensor([[1.0, 3.0], [0.0, 0.0]]), 2, "max", 0.5, 1.0)
    >>> values.reduced.tolist(), values.leaf.tolist(), values.leaf.dtype
    ([3.0, 0.0], [2.0, 1.0], torch.float64)
    """
    raw = priority.to(CPU, torch.float64).contiguous()
    if raw.ndim == 0:
        raw = raw.reshape(1)
    reduced = reduce_priority(raw, n, reduction)
    # torch's pow (as the torch kernels: the same stored values); the update kernel clamps
    leaf = (reduced + eps).pow_(alpha)
    return HostPriority(raw, reduced, leaf, alpha, eps, reduction)


def leaf_limit(capacity: int) -> float:
    """Largest stored priority of a slot: ``capacity`` of them still sum to a finite float64.

    Examples
    --------
    >>> leaf_limit(1) == float(np.finfo(np.float64).max), leaf_limit(4) < 5e307
    (True, True)
    """
    return _FLOAT64_MAX / capacity


def check_stored_priority(priority: torch.Tensor, capacity: int, alpha: float,
                          eps: float) -> None:
    """Raise ``ValueError`` where the stored value ``(priority + eps) ** alpha`` of a finite host
    priority (one per slot, float64) overflows :func:`leaf_limit` (e.g. ``1e200`` with alpha 2).

    Examples
    --------
    >>> check_stored_priority(torch.tensor([1e100], dtype=torch.float64), 10, 2.0, 0.0)
    >>> try:
    ...     check_stored_priority(torch.tensor([1e200], dtype=torch.float64), 10, 2.0, 0.0)
    ... except ValueError as err:
    ...     print(str(err)[:25])
    priority [1e+200] overflo
    """
    if not priority.numel():
        return
    limit = leaf_limit(capacity)
    leaf = leaf_values(priority, alpha, eps)
    if not float(leaf.max()) <= limit:
        bad = priority[~(leaf <= limit)].reshape(-1)
        raise ValueError(f"priority {bad[:5].tolist()} overflows: (priority + eps) ** alpha "
                         f"with alpha={alpha}, eps={eps} must stay <= {limit:.4g} (the largest "
                         f"float64 / max_capacity {capacity}, so that the sum of the stored "
                         "priorities stays finite). Nothing was updated.")


def host_bounds(slots: torch.Tensor) -> tuple[int, int]:
    """``(least, largest)`` of non-empty host ``slots``, in one pass.

    Examples
    --------
    >>> host_bounds(torch.tensor([4, -1, 7]))
    (-1, 7)
    """
    lo, hi = torch.aminmax(slots)
    return int(lo), int(hi)


def check_slots(slots: torch.Tensor, capacity: int,
                bounds: tuple[int, int] | None = None) -> None:
    """Raise ``IndexError`` unless every host slot lies in ``[0, capacity)`` (``bounds``: their
    :func:`host_bounds`, when known)."""
    lo, hi = bounds if bounds is not None else host_bounds(slots)
    if lo < 0 or hi >= capacity:
        raise IndexError(f"slots must lie in [0, {capacity}) (max_capacity), got "
                         f"values in [{lo}, {hi}].")


def prepare_update(index: Any, priority: Any, write_generation: Any
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(flat int64 index, priorities matching it, flat write generations or None)`` of an
    update, checked for types and shapes.

    Examples
    --------
    >>> index, raw, token = prepare_update(torch.tensor([[0, 1]]), 2.0, None)
    >>> index.tolist(), raw.tolist(), token
    ([0, 1], [2.0, 2.0], None)
    """
    if type(index) is torch.Tensor and index.ndim == 1 and index.dtype is torch.long \
            and type(priority) is torch.Tensor and priority.shape == index.shape \
            and priority.dtype.is_floating_point and (write_generation is None or (
                type(write_generation) is torch.Tensor and write_generation.ndim == 1
                and write_generation.dtype is torch.long
                and write_generation.shape == index.shape)):
        # the common case (a learner's update of a sample), without the conversions below:
        # the same result
        return index, priority.detach(), write_generation
    index = as_long_tensor(index, name="index")
    raw = flat_priority(index, priority)
    token = None
    if write_generation is not None:
        token = as_long_tensor(write_generation, name="write_generation")
        if token.numel() != index.numel():
            raise ValueError(f"write_generation of shape {tuple(token.shape)} does not match "
                             f"index of shape {tuple(index.shape)}.")
        token = token.reshape(-1)
    return index.reshape(-1), raw, token


def check_options(max_capacity: Any, *, eps: Any, dtype: Any, reduction: Any, backend: Any,
                  device: Any, validate: Any) -> tuple[int, float, torch.device | None]:
    """Check a prioritized sampler's options; return ``(max_capacity, eps, device)``."""
    if isinstance(max_capacity, bool) or not isinstance(max_capacity, (int, np.integer)) \
            or max_capacity <= 0:
        raise ValueError(f"max_capacity must be a positive int, got {max_capacity!r}.")
    eps = check_real(eps, "eps")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}.")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}.")
    if backend not in (None, "numba", "torch"):
        raise ValueError(f"backend must be 'numba', 'torch' or None, got {backend!r}.")
    req_device = None if device is None else torch.device(device)
    if backend == "numba" and req_device is not None and req_device.type != "cpu":
        raise ValueError(f"the numba backend keeps its trees on CPU; got device={device!r} "
                         "(use backend='torch' or None for device trees).")
    check_flag(validate, "validate", allow_none=True)
    return int(max_capacity), eps, req_device


def slots_on(slots: torch.Tensor, capacity: int, device: torch.device,
             bounds: tuple[int, int] | None = None) -> torch.Tensor:
    """``slots`` moved to ``device``, checked to lie in ``[0, capacity)`` (``IndexError``)
    wherever they are on the host, before or after the move: never on a device (no sync).
    ``bounds``: the host slots' :func:`host_bounds`, when known."""
    checked = slots.device.type == "cpu"
    if checked:
        check_slots(slots, capacity, bounds)
    slots = slots.to(device, non_blocking=True)
    if not checked and slots.device.type == "cpu":
        check_slots(slots, capacity)
    return slots


def shown_slots(slots: torch.Tensor) -> list[Any]:
    """The first 8 of ``slots`` (1-D), and ``"..."`` when there are more: how an error names
    the slots it refuses.

    >>> shown_slots(torch.arange(10))
    [0, 1, 2, 3, 4, 5, 6, 7, '...']
    """
    return slots[:8].tolist() + (["..."] if slots.numel() > 8 else [])
