"""How a :class:`ReplayBufferEnsemble` makes one batch of its parts: ``stack_parts`` (the default
join) and ``PartsCollate`` (each part collated and transformed by its buffer, then joined)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tensordict import is_tensor_collection

from tdreplay.core import stack_items


def stack_parts(parts: list[Any]) -> Any:
    """Stack the parts of an ensemble batch along a new leading dimension, or keep the list.

    Tensors of one shape are stacked with :func:`torch.stack`. TensorDicts of one batch size are
    stacked densely when their entries agree and lazily otherwise (entries of other shapes, or
    present in some parts only, stay per part). Parts that cannot be stacked (TensorDicts of
    other batch sizes, of other entries and devices, tensors of other shapes, other objects)
    are returned as the list.

    Examples
    --------
    >>> import torch
    >>> stack_parts([torch.zeros(3), torch.ones(3)]).shape
    torch.Size([2, 3])
    >>> [p.shape for p in stack_parts([torch.zeros(3), torch.ones(2)])]
    [torch.Size([3]), torch.Size([2])]
    """
    parts = list(parts)
    if not parts:
        return parts
    first = parts[0]
    if not is_tensor_collection(first):
        return stack_items(parts)
    if any(not is_tensor_collection(p) or p.batch_size != first.batch_size for p in parts):
        return parts
    if any(p.device != first.device for p in parts):
        try:  # (a dense stack takes parts on other devices; a lazy one, of other entries, not)
            return stack_items(parts)
        except RuntimeError:
            return parts
    return stack_items(parts)


class PartsCollate:
    """Collate each ``(buffer_id, items)`` part with its buffer's ``collate_fn`` and transform,
    then join the parts with ``join``.

    It holds the member buffers, not the ensemble: an ensemble keeping a bound method of its own
    here would sit in a reference cycle, and its storages' memory would outlive its last
    reference until a gc pass.

    Examples
    --------
    >>> import torch
    >>> from tdreplay.core import ListStorage, ReplayBuffer
    >>> rbs = [ReplayBuffer(storage=ListStorage(4)), ReplayBuffer(storage=ListStorage(4))]
    >>> collate = PartsCollate(rbs, [rb.collate_fn for rb in rbs], stack_parts)
    >>> collate([(0, [torch.tensor(1.0)]), (1, [torch.tensor(2.0)])]).tolist()
    [[1.0], [2.0]]
    """

    def __init__(self, buffers: Sequence[Any], collate_fns: Sequence[Callable[[Any], Any]],
                 join: Callable[[list[Any]], Any]) -> None:
        self.buffers = tuple(buffers)
        self.collate_fns = list(collate_fns)
        self.join = join

    def __call__(self, parts: list[tuple[int, Any]]) -> Any:
        """The joined batch. The member transforms with state (``VecNorm``'s statistics) that
        ran before a part's collate or transform, or the join, raised are not put back here:
        the ensemble marks them before it draws and puts them back if any step of the read
        fails, its own transform included (``ReplayBufferEnsemble.mark_read_state``)."""
        batch = []
        for buffer_id, items in parts:
            data = self.collate_fns[buffer_id](items)
            transform = self.buffers[buffer_id].transform
            if len(transform):
                data = transform(data)
            batch.append(data)
        return self.join(batch)
