"""``stack_parts``: the default way a :class:`ReplayBufferEnsemble` joins its parts."""

from __future__ import annotations

from typing import Any

from tensordict import is_tensor_collection

from tdreplay.core import stack_items


def stack_parts(parts: list[Any]) -> Any:
    """Stack the parts of an ensemble batch along a new leading dimension, or keep the list.

    Tensors of one shape are stacked with :func:`torch.stack`. TensorDicts of one batch size are
    stacked densely when their entries agree and lazily otherwise (entries of other shapes, or
    present in some parts only, stay per part). Parts that cannot be stacked (TensorDicts of
    other batch sizes, tensors of other shapes, other objects) are returned as the list.

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
    if is_tensor_collection(parts[0]) and any(
            not is_tensor_collection(p) or p.batch_size != parts[0].batch_size for p in parts):
        return parts
    return stack_items(parts)
