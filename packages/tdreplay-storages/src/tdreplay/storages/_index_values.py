"""What ``storage[index] = value`` writes, shaped as ``storage[index]`` reads (no storage
imports): a tensor or pytree written at a tuple index of a multi-dim storage
(:func:`plain_at_index`), a value written at a multi-dim tensor of rows, whose leading
dims are those of the index (:func:`flattened_for_index`), and the batch dims of a TensorDict
written at an index that stand for the storage's dims, before an item's own
(:func:`index_batch_dims`: a new entry it brings is laid out from the dims after them), a
number written into a storage of tensors (:func:`number_value`), and the part of an index out
of range of the storage's dims, named in its layout (:func:`check_index_range`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase, is_tensor_collection
from torch.utils._pytree import tree_flatten, tree_unflatten  # noqa: PLC2701

from tdreplay.core.utils import ShapeMismatchError, is_int

from ._casts import number_tensor
from ._formats import KIND_PYTREE, KIND_TC, KIND_TENSOR
from ._keys import TENSOR_KEY

if TYPE_CHECKING:
    from ._layout import TensorLayout

__all__ = ["IndexOutOfRangeError", "check_index_range", "flattened_for_index", "format_index",
           "index_batch_dims", "number_value", "plain_at_index"]

#: what a storage of each kind of data is written (a number is written only into tensors)
_EXPECTED = {KIND_PYTREE: "a pytree of tensors of the storage's structure",
             KIND_TC: "an instance of the storage's tensorclass"}


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


def number_value(layout: TensorLayout | None, kind: str, value: Any, name: str,
                 lead: tuple[int, ...] | None = None) -> torch.Tensor:
    """``value`` (a number, argument ``name`` of a write) as the data of a storage of tensors
    laid out as ``layout``: a tensor of its dtype (cast as a tensor is cast: lossy casts
    refused, see :func:`~._casts.number_tensor`), 0-dim, or with ``lead`` (the dims of the
    rows written) expanded to ``[*lead, *item]`` as torch broadcasts ``t[0] = 3.0``.
    ``TypeError`` naming ``name`` for a storage of another kind of data (``kind``: a
    TensorDict, tensorclass or pytree storage takes no number) or never written.

    Examples
    --------
    >>> from tdreplay.storages._layout import TensorLayout
    >>> layout = TensorLayout(TensorDict({TENSOR_KEY: torch.zeros(4, 2)}, [4]), ndim=1,
    ...                       device=torch.device("cpu"))
    >>> number_value(layout, "tensor", 3, "value", (2,))
    tensor([[3., 3.],
            [3., 3.]])
    >>> number_value(layout, "tensordict", 3.0, "value")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    TypeError: value=3.0: a number is written only into a storage of tensors; this storage ...
    """
    if layout is None or kind != KIND_TENSOR:
        holds = "was never written (write a tensor first: it lays the storage out)" \
            if layout is None else \
            f"holds {kind} data: write {_EXPECTED.get(kind, 'a TensorDict')} there"
        raise TypeError(f"{name}={value!r}: a number is written only into a storage of "
                        f"tensors; this storage {holds}.")
    entry = layout.td.get(TENSOR_KEY)
    out = number_tensor(name, value, entry.dtype).to(entry.device)
    if lead is None:
        return out
    return out.expand((*lead, *entry.shape[layout.td.batch_dims:]))


class IndexOutOfRangeError(IndexError):
    """An index of a multi-dim storage out of range at one of its dims: ``dim``, the part
    ``value`` given there (an int, or the first one out of range of several) and ``size``, the
    dim's size (of the written rows at dim 0). A buffer that swaps dims (``dim_extend``) may
    name them in its own layout from these."""

    def __init__(self, message: str, *, dim: int, value: int, size: int) -> None:
        super().__init__(message)
        self.dim, self.value, self.size = dim, value, size


def format_index(index: Any) -> str:
    """``index`` as written between brackets: ``0, 7``, ``:, 9``, ``1:3``.

    Examples
    --------
    >>> format_index((0, 7)), format_index((slice(None), 9)), format_index(slice(1, 3))
    ('0, 7', ':, 9', '1:3')
    """
    if type(index) is tuple:
        return ", ".join(format_index(part) for part in index)
    if isinstance(index, slice):
        parts = ["" if x is None else str(x) for x in (index.start, index.stop, index.step)]
        return ":".join(parts if index.step is not None else parts[:2])
    if index is Ellipsis:
        return "..."
    return repr(index)


def _out_of_range(part: Any, size: int) -> int | None:
    """The value of ``part`` (an int or integer indices) out of ``[-size, size)``, if any."""
    if is_int(part):
        value = int(part)
        return None if -size <= value < size else value
    if isinstance(part, (list, np.ndarray)):
        try:
            part = torch.as_tensor(part)
        except (TypeError, ValueError, RuntimeError):
            return None
    if not isinstance(part, torch.Tensor) or not part.numel() or part.dtype is torch.bool \
            or part.is_floating_point() or part.is_complex():
        return None
    lo, hi = (int(v) for v in torch.aminmax(part.reshape(-1)))
    return hi if hi >= size else lo if lo < -size else None


def check_index_range(shape: Sequence[int], index: Any, what: str) -> None:
    """Raise :class:`IndexOutOfRangeError` (an ``IndexError``) for the first part of
    ``index`` (a tuple, one part a dim, or one part) out of range of ``shape``, the storage's
    dims as it reads them (``[written rows, *inner]``), naming ``what`` (how the user wrote
    the call), the dim and the valid range there in the storage's layout. Parts past
    ``shape`` (an item's own dims), slices, masks and an index with ``...`` or ``None`` are
    left to torch.

    Examples
    --------
    >>> check_index_range((6, 2), (0, 1), "storage[0, 1]")
    >>> check_index_range((6, 2), (0, 7), "storage[0, 7]")
    Traceback (most recent call last):
    ...
    tdreplay.storages._index_values.IndexOutOfRangeError: storage[0, 7]: index 7 is out of range for dim 1 (size 2) of the storage's layout [6, 2] (dim 0: its 6 written rows); valid indices at dim 1: -2 to 1.
    """  # noqa: E501
    parts = index if type(index) is tuple else (index,)
    if any(part is Ellipsis or part is None for part in parts):
        return
    for dim, part in enumerate(parts[:len(shape)]):
        size = int(shape[dim])
        value = _out_of_range(part, size)
        if value is None:
            continue
        valid = f"{-size} to {size - 1}" if size else "none"
        raise IndexOutOfRangeError(
            f"{what}: index {value} is out of range for dim {dim} (size {size}) of the "
            f"storage's layout {list(shape)} (dim 0: its {shape[0]} written rows); valid "
            f"indices at dim {dim}: "
            f"{valid}.", dim=dim, value=value, size=size)
