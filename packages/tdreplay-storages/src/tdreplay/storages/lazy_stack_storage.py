"""``LazyStackStorage``: a list storage of TensorDicts returned as lazy stacks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tensordict import LazyStackedTensorDict, is_tensor_collection

from tdreplay.core import ListStorage, StorageCheckpointerBase
from tdreplay.core.utils import check_flag, is_int


class LazyStackStorage(ListStorage):
    """A :class:`~tdreplay.core.ListStorage` whose batches are lazily stacked TensorDicts.

    Items may have different shapes (e.g. trajectories of different lengths). As TorchRL's,
    reading several items (``get(slots)``, ``storage[index]``, ``storage[a:b]``, a sample)
    returns a :class:`~tensordict.LazyStackedTensorDict` along ``stack_dim``; one item
    (``get(i)``, ``storage[i]``) is the stored TensorDict itself. The stack holds shallow copies
    of the items, so entries set on it (``"index"``, sampler info) stay out of the storage;
    their tensors are the stored ones. Tensors of one shape are stacked with
    :func:`torch.stack`; other items (strings, ragged tensors, mixed objects) come back as a
    list, as from a :class:`~tdreplay.core.ListStorage`.

    Parameters
    ----------
    max_size : int, optional
        Capacity in items; unbounded when not given (as TorchRL's ``LazyStackStorage``).
    stack_dim : int
        Dimension along which sampled items are stacked.
    compilable : bool
        Accepted as in TorchRL; no effect (see :class:`~tdreplay.core.Storage`).
    device : torch.device, str or int, optional
        Where written items go (see :class:`~tdreplay.core.ListStorage`).

    Examples
    --------
    >>> import torch
    >>> from tensordict import TensorDict
    >>> s = LazyStackStorage(10)
    >>> s.set(torch.arange(2), [TensorDict(a=torch.zeros(3), batch_size=[3]),
    ...                         TensorDict(a=torch.zeros(5), batch_size=[5])])
    >>> batch = s.get(torch.tensor([0, 1]))
    >>> type(batch).__name__, batch[1]["a"].shape, s[0]["a"].shape
    ('LazyStackedTensorDict', torch.Size([5]), torch.Size([3]))
    >>> s[:].batch_size  # the second dim is ragged
    torch.Size([2, -1])
    """

    def __init__(self, max_size: int | None = None, *, stack_dim: int = 0,
                 checkpointer: StorageCheckpointerBase | None = None,
                 compilable: bool = False,
                 device: torch.device | str | int | None = None) -> None:
        if not is_int(stack_dim) or isinstance(stack_dim, torch.Tensor):
            raise TypeError(f"LazyStackStorage: stack_dim must be an int, got {stack_dim!r} "
                            f"({type(stack_dim).__name__}).")
        super().__init__(max_size, checkpointer, compilable=compilable, device=device)
        self.stack_dim = int(stack_dim)

    def set(self, cursor: int | slice | torch.Tensor | Sequence[int], data: Any, *,
            set_cursor: bool = True) -> None:
        """As :meth:`ListStorage.set <tdreplay.core.ListStorage.set>`; refuses, before anything
        is written, items that ``stack_dim`` cannot stack (``ValueError`` naming it)."""
        if set_cursor is not True and set_cursor is not False:  # (one check when a bool)
            check_flag(set_cursor, "set_cursor")
        if is_int(cursor):
            self._check_stack_dim([data])
        elif (is_tensor_collection(data) or isinstance(data, torch.Tensor)) and _dims(data):
            self._check_stack_dim([], item_dims=_dims(data) - 1)  # (no dims: ListStorage.set)
        elif isinstance(data, list):
            self._check_stack_dim(data)
        super().set(cursor, data, set_cursor=set_cursor)

    def _check_stack_dim(self, items: list[Any], item_dims: int | None = None) -> None:
        """``ValueError`` when ``stack_dim`` is out of range for items of ``item_dims`` dims (or
        for the TensorDicts and tensors among ``items``); other items are never stacked."""
        dims = [] if item_dims is None else [item_dims]
        dims += [_dims(x) for x in items if is_tensor_collection(x) or isinstance(x, torch.Tensor)]
        for n in dims:
            if not -(n + 1) <= self.stack_dim <= n:
                raise ValueError(
                    f"LazyStackStorage: stack_dim={self.stack_dim} is out of range for items "
                    f"with {n} batch dims (it must be in [{-(n + 1)}, {n}]); nothing was written."
                )

    def get(self, index: int | slice | torch.Tensor) -> Any:
        if isinstance(index, torch.Tensor) and index.ndim > 1:
            index = index.reshape(-1)  # (one lazy stack of the items, as before)
        items = super().get(index)
        return items if is_int(index) else self._stacked(items)

    def __getitem__(self, index: Any) -> Any:
        items = super().__getitem__(index)
        return items if is_int(index) else self._stacked(items)

    def default_collate(self, data: Any) -> Any:
        return self._stacked(data)

    def _stacked(self, items: Any) -> Any:
        """``items`` (a list read from the storage) as one batch along ``stack_dim``."""
        if not isinstance(items, list) or not items:
            return items
        if all(is_tensor_collection(x) for x in items):
            # stack shallow copies: entries set on a batch (e.g. "index") stay out of storage
            return LazyStackedTensorDict.lazy_stack([x.copy() for x in items], dim=self.stack_dim)
        first = items[0]
        if isinstance(first, torch.Tensor) and all(
                isinstance(x, torch.Tensor) and x.shape == first.shape for x in items):
            return torch.stack(items, dim=self.stack_dim)
        return items


def _dims(x: Any) -> int:
    """The batch dims of a TensorDict, the dims of a tensor."""
    return int(x.batch_dims) if is_tensor_collection(x) else int(x.ndim)
