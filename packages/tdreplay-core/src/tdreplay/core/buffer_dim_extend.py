"""TorchRL's ``dim_extend``: the dimension of a batch that ``extend`` writes along.

:class:`ExtendDimMixin` is the room of :class:`~tdreplay.core.ReplayBuffer` that turns what
``extend`` gets into the rows of the storage and reads them back (``rb[i]``). As TorchRL's,
``dim_extend`` defaults to ``storage.ndim - 1``: a ``LazyTensorStorage(N, ndim=2)`` extended
with ``[B, T]`` batches (``B`` environments, ``T`` steps) is written along ``T``, one storage
row per time step. The storage is laid out ``[N // B, B]``, time-major, and each environment's
steps stay contiguous in time across extends (the slice samplers read trajectories down the
rows). With ``dim_extend=0`` batches are written along their first dimension as they are
(``[T, B]`` batches of a time-major collector). ``add`` writes one row and ignores it.

Reads and index assignment (``rb[i]``, ``rb[i] = x``) address dimension ``dim_extend`` of the
written data, as TorchRL's: with ``dim_extend=1`` ``rb[0]`` is environment 0's written steps.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tensordict import is_tensor_collection
from torch.utils._pytree import tree_map  # noqa: PLC2701 (no public pytree in torch 2.13)

from .buffer_items import as_batch
from .storage import ListStorage, Storage
from .transform import Compose
from .transform_state import transform_mark, undo_transforms
from .utils import (
    INT_TYPES,
    DataKindMismatchError,
    DimExtendError,
    ShapeMismatchError,
    clone_exact,
)


def check_dim_extend(dim_extend: Any) -> int | None:
    """``dim_extend`` checked: ``None`` (``storage.ndim - 1``) or an int ``>= 0``.

    Examples
    --------
    >>> check_dim_extend(1), check_dim_extend(None)
    (1, None)
    >>> check_dim_extend(-1)
    Traceback (most recent call last):
    ...
    ValueError: dim_extend must be a positive value (an int >= 0 or None), got -1.
    """
    if dim_extend is None:
        return None
    if not isinstance(dim_extend, INT_TYPES) or isinstance(dim_extend, bool) or dim_extend < 0:
        raise ValueError("dim_extend must be a positive value (an int >= 0 or None), got "
                         f"{dim_extend!r}.")
    return int(dim_extend)


def _move_dim(data: Any, dim: int) -> Any:
    """``data`` (a tensor, tensor collection or tuple / list / dict pytree of them) with dims
    ``dim`` and ``0`` swapped; refuses data with too few batch dims naming ``dim_extend``."""
    if isinstance(data, (tuple, list)):  # a pytree, as TorchRL's tree_map
        return type(data)(_move_dim(x, dim) for x in data)
    if isinstance(data, dict):
        return {k: _move_dim(v, dim) for k, v in data.items()}
    if is_tensor_collection(data) or isinstance(data, torch.Tensor):
        dims = data.ndim if isinstance(data, torch.Tensor) else data.batch_dims
        if dims <= dim:
            raise DimExtendError(f"dim_extend={dim} but the data has {dims} batch dims: "
                                 f"extend writes along dim {dim} (dim_extend: batch dims > "
                                 f"{dim}).")
        return data.transpose(dim, 0)
    raise TypeError(f"dim_extend={dim} writes a batch along dim {dim}: it needs tensors or "
                    f"TensorDicts, got {type(data).__name__}.")


def other_dims_mismatch(moved: Any, storage_shape: Any, dim: int) -> ShapeMismatchError | None:
    """Why a storage refused a batch moved along ``dim`` (``dim_extend``; ``moved``: that dim
    first), when it is the batch's other dims (e.g. its number of environments): a
    :class:`~tdreplay.core.utils.ShapeMismatchError` that says so in the layout the batch was
    given in (the storage's own is time-major). ``None`` when they fit (or ``dim`` is 0)."""
    if not dim or storage_shape is None or len(storage_shape) < 2:
        return None
    shape = moved.shape if isinstance(moved, torch.Tensor) else getattr(moved, "batch_size", None)
    ndim = len(storage_shape)
    if shape is None or len(shape) < ndim or shape[1:ndim] == storage_shape[1:ndim]:
        return None
    given = list(shape)
    given[0], given[dim] = given[dim], given[0]
    expected: list[Any] = list(storage_shape[1:ndim])
    expected.insert(dim, "*")
    return ShapeMismatchError(
        f"extend got a batch of shape {given[:ndim]} (its first {ndim} dims) but this storage "
        f"(ndim={ndim}, dim_extend={dim}) holds batches of shape "
        f"[{', '.join(map(str, expected))}] (any size along dim {dim}): e.g. as many "
        "environments as its first extend had.")


class ExtendDimMixin:
    """``dim_extend`` of a buffer (mixed into :class:`ReplayBuffer`)."""

    _storage: Storage
    _transform: Compose
    _lock: AbstractContextManager[Any]
    _collate_fn: Callable[[Any], Any]
    _dim_extend_arg: int | None = None

    if TYPE_CHECKING:  # what the buffer this is mixed into provides
        def _write_side(self, data: Any) -> Any: ...

    @property
    def dim_extend(self) -> int:
        """The dimension of a batch that ``extend`` writes along (TorchRL's ``dim_extend``):
        the one given, else ``storage.ndim - 1``.

        Examples
        --------
        >>> from tdreplay.core import ListStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=ListStorage(10))
        >>> rb.dim_extend  # storage.ndim - 1
        0
        >>> rb = ReplayBuffer(storage=ListStorage(10), dim_extend=1)
        >>> rb.extend(torch.arange(6).reshape(2, 3)).tolist()  # 2 envs, 3 steps: 3 items
        [0, 1, 2]
        >>> rb.storage.get(0).tolist()  # step 0 of both envs
        [0, 3]
        """
        if self._dim_extend_arg is not None:
            return self._dim_extend_arg
        return max(self._storage.ndim - 1, 0)

    @dim_extend.setter
    def dim_extend(self, value: int | None) -> None:
        """As TorchRL's: the value it has (or ``None``) is accepted, another one refused with
        TorchRL's ``RuntimeError`` (a buffer's writes keep one layout)."""
        if value is not None and check_dim_extend(value) != self.dim_extend:
            raise RuntimeError(f"dim_extend cannot be reset (it is {self.dim_extend}, got "
                               f"{value}). Please create a new replay buffer.")

    def _set_dim_extend(self, dim_extend: Any) -> None:
        self._dim_extend_arg = check_dim_extend(dim_extend)

    def _prepare_batch(self, data: Any) -> tuple[Any, int]:
        """Check that ``data`` is a batch, run the write-side transforms and move
        ``dim_extend`` first (no lock held); returns the batch (``None`` when a transform
        dropped it) and ``dim_extend``."""
        if isinstance(data, tuple) and isinstance(self._storage, ListStorage):
            raise DataKindMismatchError(
                "extend got a tuple (a pytree, written as one batched structure) but the storage "
                "is a ListStorage, which stores unbound items: pass a list of items instead."
            )
        data = self._write_side(as_batch(data))  # any iterable of items: a list
        dim = self.dim_extend
        if not dim or data is None:  # (None: the write-side transforms dropped the batch)
            return data, dim
        return _move_dim(data, dim), dim

    @staticmethod
    def _written_as_given(slots: torch.Tensor, data: Any, dim: int) -> torch.Tensor:
        """The slots ``extend`` wrote ``data`` (the batch :meth:`_prepare_batch` moved along
        ``dim``) to, in the layout of the batch it got: ``dim`` moved back (unless the writer
        kept only some rows)."""
        if not dim:
            return slots
        if isinstance(data, torch.Tensor):
            shape = data.shape[: dim + 1]
        elif is_tensor_collection(data):
            shape = data.batch_size[: dim + 1]
        else:
            return slots
        if len(shape) <= dim or slots.numel() != shape.numel():
            return slots
        return slots.reshape(shape).transpose(dim, 0)

    def _along_dim_extend(self, index: Any) -> tuple[Any, bool]:
        """The storage index of user index ``index`` (dims ``0`` and ``dim_extend`` swapped, as
        TorchRL's ``rb[i]``) and whether both dims are kept (their data is then swapped too)."""
        dim = self.dim_extend
        if not dim or isinstance(index, str):
            return index, False
        parts = list(index) if isinstance(index, tuple) else [index]
        parts += [slice(None)] * (dim + 1 - len(parts))
        parts[0], parts[dim] = parts[dim], parts[0]
        return tuple(parts), not (_drops_dim(parts[0]) or _drops_dim(parts[dim]))

    def _swap_value(self, index: Any, value: Any) -> tuple[Any, Any]:
        """``rb[index] = value`` as a storage index and value (see :meth:`_along_dim_extend`)."""
        index, swap = self._along_dim_extend(index)
        return index, _swap_read(value, self.dim_extend) if swap else value

    def __getitem__(self, index: Any) -> Any:
        """The written items at ``index`` (an int, slice, tensor of slots, ...), collated and
        passed through the read transforms, as TorchRL's ``rb[index]``.

        Read from a tensor storage, it is a copy taken under the buffer's lock: its tensors
        share no memory with the storage (TorchRL returns views for int and slice indices), so
        a later write, from this thread or another, never changes it or leaves it half old,
        half new, and editing it does not write to the buffer (``rb[index] = x``, ``set_`` and
        ``update_`` do, keeping the samplers' bookkeeping). ``rb.storage[index]`` reads without
        a copy. A :class:`~tdreplay.core.ListStorage` returns its items as they were stored
        (the objects given to ``extend``), as TorchRL's; the read transforms of the buffer
        then work on a shallow copy of a TensorDict item, so they do not edit the stored one
        (TorchRL's do).

        Examples
        --------
        >>> from tdreplay.core import ListStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=ListStorage(4))
        >>> _ = rb.extend([torch.tensor(0.0), torch.tensor(1.0)])
        >>> first_two = rb[:2]
        >>> _ = rb.extend([torch.tensor(9.0), torch.tensor(9.0)])
        >>> first_two.tolist(), rb[:].tolist()
        ([0.0, 1.0], [0.0, 1.0, 9.0, 9.0])
        """
        at, swap = self._along_dim_extend(index)
        with self._lock:
            data = self._storage[at]
            if not isinstance(self._storage, ListStorage) and not _copies_rows(at):
                data = _copy_read(data)
        if swap:
            data = _swap_read(data, self.dim_extend)
        if not isinstance(index, int):
            data = self._collate_fn(data)
        if self._transform.transforms:
            if isinstance(index, int) and is_tensor_collection(data) \
                    and isinstance(self._storage, ListStorage):
                # the stored item itself: the transforms set their entries into a copy
                # (renamed, cast or unsqueezed in place, the item read differently next time)
                data = data.copy()
            if self._transform.has_state:  # put back if a later transform refuses (VecNorm)
                with self._lock:
                    mark = transform_mark(self._transform)
                    try:
                        return self._transform(data)
                    except BaseException:
                        undo_transforms(self._transform, mark)
                        raise
            data = self._transform(data)
        return data


def _copies_rows(index: Any) -> bool:
    """Whether indexing a tensor storage with ``index`` already copies (advanced indexing: a
    tensor of at least one dim, a list or an array, alone or in a tuple)."""
    if isinstance(index, tuple):
        return any(_copies_rows(part) for part in index)
    if isinstance(index, torch.Tensor):
        return index.ndim > 0
    return isinstance(index, (list, np.ndarray))


def _copy_read(data: Any) -> Any:
    """``data`` read from a storage with every tensor and tensor collection in it copied
    (along any pytree of them); other objects as they are."""
    return tree_map(_clone_tensors, data, is_leaf=is_tensor_collection)


def _clone_tensors(leaf: Any) -> Any:
    # (bit-exact: TensorDict.clone() turns -0.0 into +0.0 on a TensorDict with a device)
    return clone_exact(leaf) if isinstance(leaf, torch.Tensor) or is_tensor_collection(leaf) \
        else leaf


def _drops_dim(part: Any) -> bool:
    """Whether index ``part`` removes its dimension (an int or a 0-d tensor)."""
    return isinstance(part, INT_TYPES) or (isinstance(part, torch.Tensor) and part.ndim == 0)


def _swap_read(data: Any, dim: int) -> Any:
    """``data`` with dims ``0`` and ``dim`` swapped where it has them (leaves of pytrees too)."""
    if isinstance(data, (tuple, list)):
        return type(data)(_swap_read(x, dim) for x in data)
    if isinstance(data, dict):
        return {k: _swap_read(v, dim) for k, v in data.items()}
    if isinstance(data, torch.Tensor):
        return data.transpose(dim, 0) if data.ndim > dim else data
    if is_tensor_collection(data):
        return data.transpose(dim, 0) if data.batch_dims > dim else data
    return data
