"""The first item of a ``ListStorage`` a sampler cannot read (:func:`first_unreadable_item`):
what the slice samplers and ``PromptGroupSampler`` name when reading its items failed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tensordict import is_tensor_collection

from tdreplay.core import ListStorage, Storage

__all__ = ["first_unreadable_item"]


def first_unreadable_item(storage: Storage, keys: Sequence[Any]
                          ) -> tuple[int, Any, str] | None:
    """``(slot, key, type name)`` of the first item of ``storage`` (a ``ListStorage``; any
    other storage: ``None``) that is no TensorDict (``key`` ``None``, the item's type named)
    or lacks one of ``keys`` (that key); ``None`` when every item reads. Reads every item:
    for error messages only.

    Examples
    --------
    >>> import torch
    >>> from tensordict import TensorDict
    >>> storage = ListStorage(3)
    >>> storage.set([0, 1, 2], [TensorDict(a=torch.tensor(0)), TensorDict(), 7])
    >>> first_unreadable_item(storage, ["a"])
    (1, 'a', 'TensorDict')
    >>> first_unreadable_item(storage, [])
    (2, None, 'int')
    """
    if not isinstance(storage, ListStorage):
        return None
    for slot in range(len(storage)):
        item = storage.get(slot)
        if not is_tensor_collection(item):
            return slot, None, type(item).__name__
        for key in keys:
            if item.get(key, None) is None:
                return slot, key, type(item).__name__
    return None
