"""What ``storage[index] = value`` writes, shaped as ``storage[index]`` reads (no storage
imports): a tensor or pytree written at a tuple index of a multi-dim storage
(:func:`plain_at_index`), a value written at a multi-dim tensor of rows, whose leading
dims are those of the index (:func:`flattened_for_index`), and the batch dims of a TensorDict
written at an index that stand for the storage's dims, before an item's own
(:func:`index_batch_dims`: a new entry it brings is laid out from the dims after them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase, is_tensor_collection
from torch.utils._pytree import tree_flatten, tree_unflatten  # noqa: PLC2701

from tdreplay.core.utils import ShapeMismatchError

from ._keys import TENSOR_KEY

if TYPE_CHECKING:
    from ._layout import TensorLayout

__all__ = ["flattened_for_index", "index_batch_dims", "plain_at_index"]


def plain_at_index(layout: TensorLayout, rows: int, index: tuple[Any, ...],
                   td: TensorDictBase) -> TensorDictBase:
    """``td`` (a tensor or a pytree written by ``storage[index] = value``, as a TensorDict
    without batch dims: ``to_tensordict(value, batched=False)``) as the batch ``index`` selects
    in the first ``rows`` rows of ``layout``, each leaf broadcast to its entry's shape there,
    as torch's (and TorchRL's) tensor assignment broadcasts it. ``ShapeMismatchError`` (a
    ``ValueError``) naming the data for a leaf that does not fit; what indexing raises for an
    index out of the rows.

    Examples
    --------
    >>> from tdreplay.storages._layout import TensorLayout
    >>> layout = TensorLayout(TensorDict({TENSOR_KEY: torch.zeros(4, 3)}, [4, 3]), ndim=2,
    ...                       device=torch.device("cpu"))
    >>> plain_at_index(layout, 2, (slice(None), 1),
    ...                TensorDict({TENSOR_KEY: torch.tensor(5.0)}, []))[TENSOR_KEY].tolist()
    [5.0, 5.0]
    >>> two = TensorDict({TENSOR_KEY: torch.ones(2)}, [])
    >>> plain_at_index(layout, 2, (0,), two)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    tdreplay.core.utils.ShapeMismatchError: value of shape (2,) for the data does not fit ...
    """
    stored = layout.td
    lead = torch.zeros(()).expand(rows, *stored.batch_size[1:])[index].shape
    out: dict[str, Any] = {}
    for key, x in td.items():  # (top-level tensors: the data, or the pytree's leaves)
        entry = stored.get(key, None)
        if entry is None:  # (not a leaf of the storage: the write names it)
            out[key] = x
            continue
        shape = lead + entry.shape[stored.batch_dims:]
        try:
            fits = torch.broadcast_shapes(x.shape, shape) == shape
        except RuntimeError:
            fits = False
        if not fits:
            where = "the data" if key == TENSOR_KEY else f"leaf {key} of the pytree"
            raise ShapeMismatchError(
                f"value of shape {tuple(x.shape)} for {where} does not fit its entry of shape "
                f"{tuple(shape)} at index {index!r} (nothing was written).")
        out[key] = x.expand(shape)
    return TensorDict(out, batch_size=lead, device=td.device)


def flattened_for_index(index: Any, value: Any) -> Any:
    """``value`` written at ``index``, an integer tensor or array of several dims (``rb[idx] =
    rb[idx]`` with ``idx`` of shape ``[2, 2]``, which reads a batch of that shape): its leading
    dims, those of ``index``, flattened into one, as are the rows ``index`` selects. ``value``
    as it is for any other index, or when its leading dims are not those of ``index`` (the
    write then names the shape it expects).

    Examples
    --------
    >>> flattened_for_index(torch.tensor([[0, 1], [2, 0]]), torch.arange(4).reshape(2, 2))
    tensor([0, 1, 2, 3])
    >>> flattened_for_index(torch.tensor([0, 1]), torch.arange(4).reshape(2, 2)).shape
    torch.Size([2, 2])
    """
    if not isinstance(index, (torch.Tensor, np.ndarray)) or index.ndim < 2 \
            or index.dtype in (torch.bool, np.bool_):
        return value
    shape = tuple(index.shape)
    dims = len(shape)
    if is_tensor_collection(value):
        batch = tuple(value.batch_size)
        if batch[:dims] != shape:
            return value
        return value.reshape(-1, *batch[dims:])
    leaves, spec = tree_flatten(value)
    if not leaves or not all(isinstance(x, torch.Tensor) and tuple(x.shape[:dims]) == shape
                             for x in leaves):
        return value
    return tree_unflatten([x.reshape(-1, *x.shape[dims:]) for x in leaves], spec)


def index_batch_dims(layout: TensorLayout, td: TensorDictBase) -> int | None:
    """How many leading batch dims of ``td`` (a TensorDict written by ``storage[index] = td``
    at an index of the storage's dims) stand for those dims: its batch dims less the item's
    own batch dims (those of the layout's TensorDict after ``[rows, *inner]``), which must end
    its batch shape. ``None`` when they do not: the shape of an entry ``td`` adds is then not
    known (the write refuses the entry, naming it). A new entry of ``td`` is laid out as
    ``[rows, *inner, *leaf.shape[skip:]]`` (``skip``: the count returned), as TensorDict lays
    out a new key written at an index: the data's own dims after its batch dims.

    Examples
    --------
    >>> from tdreplay.storages._layout import TensorLayout
    >>> layout = TensorLayout(TensorDict({"x": torch.zeros(4, 3, 5)}, [4, 3, 5]), ndim=2,
    ...                       device=torch.device("cpu"))  # an item has its own dim of 5
    >>> index_batch_dims(layout, TensorDict({"x": torch.ones(2, 5)}, [2, 5]))  # at (:2, 0)
    1
    >>> index_batch_dims(layout, TensorDict({"x": torch.ones(5)}, [5]))  # at (0, 1)
    0
    >>> index_batch_dims(layout, TensorDict({"x": torch.ones(2, 5)}, [2])) is None
    True
    """
    own = layout.td.batch_size[len(layout.shape):]
    skip = td.batch_dims - len(own)
    if skip < 0 or td.batch_size[skip:] != own:
        return None
    return skip
