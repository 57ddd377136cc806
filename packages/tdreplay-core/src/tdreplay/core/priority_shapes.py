"""How priorities line up with the index they update: the one rule every buffer kind applies.

``update_priority(index, priority)`` takes, for an index of shape ``S``: a number; a tensor of
shape ``S``, or of ``S`` with dims of size 1 added or dropped (``[n, 1]`` for ``[n]``); a
leading part of ``S`` (``[B]`` for an index of ``[B, T]``: one value per slice, for each of
its steps, as TorchRL pairs a priority with the index's first dim); a shape that broadcasts
to ``S``; or ``S`` followed by trailing dims (several values per item, which a sampler
reduces with its ``reduction``). A leading part wins over broadcasting: ``[4]`` for an index
of ``[4, 4]`` is one value per row, never one per column. :func:`priority_for_index` lays a
priority out that way, for a single buffer's sampler, an ensemble and a sharded buffer alike.
"""

from __future__ import annotations

import torch

__all__ = ["priority_for_index"]


def priority_for_index(priority: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """``priority`` of ``shape`` (an index's), or of ``shape`` followed by the trailing dims a
    sampler reduces; ``ValueError`` for any other shape (nothing is paired in flat order
    across other shapes).

    Examples
    --------
    >>> import torch
    >>> index = torch.Size([2, 3])
    >>> priority_for_index(torch.tensor(2.0), index).shape
    torch.Size([2, 3])
    >>> priority_for_index(torch.ones(3), index).shape, priority_for_index(torch.ones(2, 3, 4),
    ...                                                                    index).shape
    (torch.Size([2, 3]), torch.Size([2, 3, 4]))
    >>> priority_for_index(torch.ones(3, 1), torch.Size([3])).shape
    torch.Size([3])
    >>> priority_for_index(torch.tensor([1.0, 2.0]), torch.Size([2, 2])).tolist()
    [[1.0, 1.0], [2.0, 2.0]]
    >>> priority_for_index(torch.ones(3, 2), index)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: priority of shape (3, 2) does not match index of shape (2, 3): expected a ...
    """
    if priority.shape == shape:
        return priority
    if priority.ndim == 0:
        return priority.expand(shape)
    if _squeezed(priority.shape) == _squeezed(shape):  # e.g. [n, 1] for [n]
        return priority.reshape(shape)
    if priority.ndim > len(shape) and priority.shape[:len(shape)] == shape:
        return priority  # (values per item, reduced by the sampler)
    if 0 < priority.ndim < len(shape) and shape[:priority.ndim] == priority.shape:
        leading = priority.reshape(priority.shape + (1,) * (len(shape) - priority.ndim))
        return leading.expand(shape)  # (one value per slice, for each of its steps)
    try:
        if torch.broadcast_shapes(priority.shape, shape) == shape:
            return priority.expand(shape)
    except RuntimeError:
        pass
    raise ValueError(f"priority of shape {tuple(priority.shape)} does not match index of shape "
                     f"{tuple(shape)}: expected a scalar, the index shape (dims of size 1 "
                     "aside), its leading dims, a shape that broadcasts to it, or the index "
                     "shape followed by trailing dims to reduce. Nothing was updated.")


def _squeezed(shape: torch.Size) -> tuple[int, ...]:
    """``shape`` without its dims of size 1."""
    return tuple(d for d in shape if d != 1)
