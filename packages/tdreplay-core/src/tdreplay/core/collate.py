"""Collate functions: how the items a storage returns become one batch."""

from __future__ import annotations

from typing import Any

import torch
from tensordict import LazyStackedTensorDict, is_tensor_collection
from torch.utils._pytree import tree_flatten, tree_unflatten  # noqa: PLC2701 (no public pytree in torch 2.13)


def identity_collate(data: Any) -> Any:
    """Return ``data`` unchanged (tensor storages already return a batch).

    Examples
    --------
    >>> identity_collate([1, 2])
    [1, 2]
    """
    return data


class ItemRows(list):  # type: ignore[type-arg]
    """The items of one row of a multi-dim index, as a storage of objects reads them (nested
    ``ItemRows`` for more dims): :func:`stack_items` stacks them row by row, then the rows, so
    that the batch takes the index's shape. A plain list item stays an item.

    Examples
    --------
    >>> stack_items([ItemRows([torch.zeros(2), torch.ones(2)])] * 3).shape
    torch.Size([3, 2, 2])
    """


def stack_items(items: Any) -> Any:
    """Stack a list of items into a batch when they are stackable, else return the list.

    Tensors of one shape are stacked with :func:`torch.stack`; TensorDicts are stacked densely
    when their shapes agree and lazily otherwise; tuples/dicts of tensors (pytrees) are stacked
    leaf by leaf; lists of items (read at a multi-dim index) are stacked row by row, then the
    rows. Anything else (strings, mixed objects) stays a list.

    Examples
    --------
    >>> stack_items([torch.zeros(2), torch.ones(2)]).shape
    torch.Size([2, 2])
    >>> stack_items(["a", "b"])
    ['a', 'b']
    """
    if not isinstance(items, list) or not items:
        return items
    first = items[0]
    if type(first) is ItemRows:  # items read at a multi-dim index (ListStorage.get)
        rows = [stack_items(row) for row in items]
        if any(type(row) is ItemRows for row in rows):  # (a row that does not stack)
            return items
        return stack_items(rows)
    if isinstance(first, torch.Tensor):
        if all(isinstance(x, torch.Tensor) and x.shape == first.shape for x in items):
            return torch.stack(items)
        return items
    if is_tensor_collection(first):
        if not all(is_tensor_collection(x) for x in items):
            return items
        stacked = LazyStackedTensorDict.maybe_dense_stack(items)
        if isinstance(stacked, LazyStackedTensorDict) and any(
                x is y for x, y in zip(stacked.tensordicts, items)):
            # a lazy stack holds the items themselves (e.g. a storage's): stack shallow copies,
            # so entries set on the batch ("index", sampler info) stay out of the items
            stacked = LazyStackedTensorDict.maybe_dense_stack([x.copy() for x in items])
        return stacked
    if type(first) is dict or type(first) is tuple:
        stacked = _stack_flat(items, first)
        if stacked is not None:
            return stacked
    if isinstance(first, (tuple, dict)):
        flat, spec = tree_flatten(first)
        if not flat or not all(isinstance(x, torch.Tensor) for x in flat):
            return items
        flats = []
        for item in items:
            leaves, item_spec = tree_flatten(item)
            if item_spec != spec:
                return items
            flats.append(leaves)
        try:
            stacked_leaves = [torch.stack(group) for group in zip(*flats)]
        except (RuntimeError, TypeError):  # other shapes, or a later item's leaf no tensor
            return items
        return tree_unflatten(stacked_leaves, spec)
    return items


def _stack_flat(items: list[Any], first: dict[Any, Any] | tuple[Any, ...]) -> Any:
    """The items stacked entry by entry when each is a flat dict (the same keys) or a flat
    tuple (the same length) of tensors of one shape per entry, as ``first``: the common item,
    without flattening every one as a pytree. ``None`` for anything else (the general path
    decides)."""
    try:
        if isinstance(first, dict):
            keys = first.keys()
            if not all(type(x) is dict and x.keys() == keys for x in items):
                return None
            return {key: torch.stack([x[key] for x in items]) for key in keys}
        width = len(first)
        if not width or not all(type(x) is tuple and len(x) == width for x in items):
            return None
        return tuple(torch.stack(list(group)) for group in zip(*items))
    except (TypeError, RuntimeError):  # an entry that is no tensor, or of another shape
        return None
