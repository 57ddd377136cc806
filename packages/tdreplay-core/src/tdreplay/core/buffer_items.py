"""What ``extend`` accepts as a batch: the conversion of plain iterables of items.

A list is a batch of items, a tuple (or dict) one pytree batched along dim 0 of its leaves,
a tensor or TensorDict a batch along its first dimension. Any other iterable of items (a
``range``, a generator, a ``set``, a ``deque``, a numpy array) is read into a list once and
then written as a list of items, as TorchRL's ``ReplayBuffer.extend`` takes "any iterable".
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from tensordict import TensorDict, is_tensor_collection

from .utils import leading_dim

__all__ = ["as_batch", "warn_if_batched_item"]


def as_batch(data: Any) -> Any:
    """``data`` as a batch ``extend`` can write, checked (``leading_dim``).

    Tensors, TensorDicts, lists, tuples and mappings (pytrees) are returned as they are; any
    other iterable (``range``, generator, ``set``, numpy array, ...) becomes the list of its
    items (a generator is consumed). A string, bytes or a single object that is not iterable
    is one item, not a batch: ``TypeError`` (use ``add``).

    Examples
    --------
    >>> as_batch(range(3))
    [0, 1, 2]
    >>> as_batch(x * x for x in range(3))
    [0, 1, 4]
    >>> as_batch([1, 2])
    [1, 2]
    >>> as_batch(7)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    TypeError: extend expects a batch of items (...), got int: use add() to write one item.
    """
    # a plain TensorDict (the hot path) is recognised at once, the Mapping ABC (the slowest
    # check) comes last
    if (type(data) is TensorDict or isinstance(data, (torch.Tensor, list, tuple))
            or is_tensor_collection(data) or isinstance(data, Mapping)):
        leading_dim(data)
        return data
    if isinstance(data, (str, bytes)) or not isinstance(data, Iterable):
        raise TypeError(
            f"extend expects a batch of items (a list or any iterable of items, a tensor or "
            f"TensorDict batched along dim 0, a tuple pytree), got {type(data).__name__}: "
            "use add() to write one item.")
    return list(data)


def warn_if_batched_item(data: Any, row_dims: int = 0) -> None:
    """Warn (``UserWarning``, as TorchRL) when ``add`` gets a TensorDict with a batch size:
    it is stored as one item with its batch dims (a sample of ``n`` has batch size
    ``[n, *data.batch_size]``), which is right for a trajectory kept whole and wrong for a batch
    of transitions meant for ``extend``. ``row_dims``: the dims one row of the storage spans
    besides the first (``ndim - 1``: a step of every environment of an ``ndim=2`` storage is
    one row, added as it should be), which the warning leaves out.

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     warn_if_batched_item(TensorDict(batch_size=[2]))
    ...     warn_if_batched_item(TensorDict(batch_size=[3]), row_dims=1)  # a row of 3 envs
    >>> len(caught), "extend()" in str(caught[0].message)
    (1, True)
    """
    if is_tensor_collection(data) and data.batch_dims > row_dims:
        warnings.warn(
            f"Using `add()` with a TensorDict that has batch_size={tuple(data.batch_size)} "
            "stores it as one item with its batch dims; use `extend()` to store each of its "
            "rows as an item.", UserWarning, stacklevel=3)
