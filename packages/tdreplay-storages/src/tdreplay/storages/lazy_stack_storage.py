"""``LazyStackStorage``: a list storage of TensorDicts returned as lazy stacks."""

from __future__ import annotations

from typing import Any

from tensordict import LazyStackedTensorDict, is_tensor_collection

from tdreplay.core import ListStorage, StorageCheckpointerBase


class LazyStackStorage(ListStorage):
    """A :class:`~tdreplay.core.ListStorage` whose batches are lazily stacked TensorDicts.

    Items may have different shapes (e.g. trajectories of different lengths); a batch is a
    :class:`~tensordict.LazyStackedTensorDict` along ``stack_dim``.

    Parameters
    ----------
    max_size : int, optional
        Capacity in items; unbounded when not given (as TorchRL's ``LazyStackStorage``).
    stack_dim : int
        Dimension along which sampled items are stacked.
    compilable : bool
        Accepted as in TorchRL; no effect (see :class:`~tdreplay.core.Storage`).

    Examples
    --------
    >>> import torch
    >>> from tensordict import TensorDict
    >>> s = LazyStackStorage(10)
    >>> s.set(torch.arange(2), [TensorDict(a=torch.zeros(3), batch_size=[3]),
    ...                         TensorDict(a=torch.zeros(5), batch_size=[5])])
    >>> batch = s.default_collate(s.get(torch.tensor([0, 1])))
    >>> type(batch).__name__, batch[1]["a"].shape
    ('LazyStackedTensorDict', torch.Size([5]))
    """

    def __init__(self, max_size: int | None = None, *, stack_dim: int = 0,
                 checkpointer: StorageCheckpointerBase | None = None,
                 compilable: bool = False) -> None:
        super().__init__(max_size, checkpointer, compilable=compilable)
        self.stack_dim = stack_dim

    def default_collate(self, data: Any) -> Any:
        if isinstance(data, list) and data and all(is_tensor_collection(x) for x in data):
            # stack shallow copies: entries set on a batch (e.g. "index") stay out of storage
            return LazyStackedTensorDict.lazy_stack([x.copy() for x in data], dim=self.stack_dim)
        return data
