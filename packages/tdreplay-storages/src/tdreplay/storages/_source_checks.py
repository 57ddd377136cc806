"""The checks of data about to go into a tensor storage's leaves (imports no storage): each entry
a tensor holding data (:func:`check_source`), and the keys, shapes and dtypes a layout's leaves
take (:class:`SourceCheck`), named where they differ.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from operator import attrgetter
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from tdreplay.core.checkpoint import CheckpointError
from tdreplay.core.utils import ShapeMismatchError

from ._casts import check_cast
from ._key_tree import leaves_along_tree
from ._keys import NestedKey, entry_label, leaf_keys

__all__ = ["SourceCheck", "check_dense", "check_source", "check_storable",
           "check_storable_leaves", "copyable_sources", "storable_dtype"]

#: ``(shape, dtype)`` of a tensor, read in one call (the write path's check).
_SHAPE_DTYPE = attrgetter("shape", "dtype")


def check_source(key: NestedKey, value: Any) -> torch.Tensor:
    """``value``, the entry ``key`` of data to store, checked to be a tensor holding data:
    ``TypeError`` for anything else, ``ValueError`` for a meta-device or sparse tensor. (Its
    dtype is checked where an entry is laid out in it, :func:`check_storable`; data written
    into an existing entry of another dtype is cast instead, ``check_cast`` decides.)

    Examples
    --------
    >>> check_source("obs", torch.zeros(2, device="meta"))
    Traceback (most recent call last):
    ...
    ValueError: entry 'obs' is a meta tensor (a shape without data): a storage holds data; ...
    """
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"entry {key!r} is a {type(value).__name__}: this storage holds a "
                        "tensor there (use LazyStackStorage or ListStorage for data of any "
                        "kind).")
    check_dense(f"entry {key!r}", value)
    return value


def check_storable(key: NestedKey, dtype: torch.dtype) -> None:
    """``TypeError`` naming entry ``key`` and what to store instead unless a tensor storage
    can lay out an entry of ``dtype`` (:func:`storable_dtype`): what a first write, a new
    entry and a preallocated storage are checked for (a restore installs what was saved).

    Examples
    --------
    >>> check_storable("pix", torch.uint16)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    TypeError: entry 'pix' has dtype torch.uint16, which this torch cannot copy into ...
    """
    if storable_dtype(dtype):
        return
    view = _SAME_SIZE.get(dtype.itemsize, torch.uint8)
    raise TypeError(f"entry {key!r} has dtype {dtype}, which this torch cannot copy into "
                    "scattered rows or clone (a ring that wraps, a read of rows), so a tensor "
                    "storage would fail half-way through a later write; store it as "
                    f"{_STORE_AS.get(dtype, 'a wider dtype')} (or as a view of the same "
                    f"bits, value.view({view}), to view back when read).")


def check_dense(what: str, value: torch.Tensor) -> None:
    """``ValueError`` naming ``what`` unless the tensor ``value`` holds dense data: a meta
    tensor has none, a sparse one none in row order (a storage copies rows, or their bytes).

    Examples
    --------
    >>> check_dense("entry 'obs'", torch.ones(2, 2).to_sparse())
    Traceback (most recent call last):
    ...
    ValueError: entry 'obs' is a torch.sparse_coo tensor: a storage holds dense data; write ...
    """
    if value.is_meta:
        raise ValueError(f"{what} is a meta tensor (a shape without data): a storage holds "
                         "data; write tensors on a real device.")
    if value.layout is not torch.strided:
        raise ValueError(f"{what} is a {value.layout} tensor: a storage holds dense data; "
                         "write value.to_dense() (or keep the tensor as it is in a ListStorage).")


def check_storable_leaves(td: TensorDictBase) -> None:
    """:func:`check_storable` for every tensor leaf of ``td`` (data about to lay out a
    storage, or a storage's preallocated tensors)."""
    for key, value in td.items(include_nested=True, leaves_only=True):
        if isinstance(value, torch.Tensor):
            check_storable(key, value.dtype)


#: an integer dtype of each item size, for the same bits of a dtype :func:`storable_dtype`
#: refuses
_SAME_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


#: what to store a dtype :func:`storable_dtype` refuses as (values kept exactly)
_STORE_AS = {torch.uint16: "torch.int32", torch.uint32: "torch.int64",
             torch.uint64: "torch.int64 (values below 2**63)",
             **{dtype: "torch.float16 / torch.bfloat16 / torch.float32"
                for dtype in (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz,
                              torch.float8_e5m2fnuz)}}


@functools.cache
def storable_dtype(dtype: torch.dtype) -> bool:
    """Whether this torch copies tensors of ``dtype`` into scattered rows (``index_copy_``)
    and tensordict clones them: what a tensor storage does with every entry (tried once per
    dtype; torch 2.13 lacks both for ``uint16`` / ``uint32`` / ``uint64`` and the float8
    dtypes on the CPU).

    Examples
    --------
    >>> storable_dtype(torch.float32), storable_dtype(torch.uint16)
    (True, False)
    """
    try:
        rows = torch.zeros(2, dtype=dtype)
        rows.index_copy_(0, torch.tensor([1]), torch.zeros(1, dtype=dtype))
        TensorDict({"x": rows}, [2]).clone()
    except (NotImplementedError, RuntimeError, TypeError):
        return False
    return True


def copyable_sources(keys: Sequence[NestedKey],
                     sources: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """``sources`` (the leaves of ``keys``, checked for keys, shapes and dtypes) ready for
    torch's copies into a storage's leaves: a meta or sparse one refused (before any leaf is
    written: the shape-and-dtype check does not see them), one that requires grad detached
    (a storage holds data: copied with its graph, every batch ever written would stay
    reachable from the storage's leaves).

    Examples
    --------
    >>> w = torch.ones(2, requires_grad=True)
    >>> copyable_sources(["a"], [w * 2])[0].requires_grad
    False
    """
    out = list(sources)
    for i, source in enumerate(out):
        if source.is_meta or source.layout is not torch.strided:
            check_dense(f"entry {keys[i]!r}", source)
        if source.requires_grad:
            out[i] = source.detach()
    return out


class SourceCheck:
    """What the data written into a layout's leaves must be: the layout's keys, each leaf's
    shape after the leading dims of the write and its dtype (another dtype is cast, unless the
    cast would lose values: :func:`~._casts.check_cast`). Data of the expected shapes and
    dtypes costs one comparison (the write path's); anything else is checked entry by entry
    and named.

    Parameters
    ----------
    keys : list
        The layout's leaf keys, in storage order.
    tree : dict
        Their :func:`tree <._key_tree.build_tree>`.
    leaves : sequence of torch.Tensor
        The layout's leaves, in storage order (only their shapes and dtypes are kept).
    ndim : int
        The leaves' leading dims counted in the storage's capacity.

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> check = SourceCheck(["a"], {"a": 0}, [torch.zeros(4, 2)], ndim=1)
    >>> check.source_leaves(TensorDict({"a": torch.ones(3, 2)}, [3]), (3,))[0].shape
    torch.Size([3, 2])
    >>> check.source_leaves(TensorDict({"b": torch.ones(3, 2)}, [3]), (3,))
    Traceback (most recent call last):
    ...
    KeyError: "data keys do not match the storage: missing ['a'], unexpected ['b']."
    """

    def __init__(self, keys: list[NestedKey], tree: dict[str, Any],
                 leaves: Sequence[torch.Tensor], ndim: int) -> None:
        self.keys = keys
        self.key_set = set(keys)
        self.tree = tree
        #: each leaf's dims past the ``ndim`` leading ones, and its dtype
        self.item_specs = [(leaf.shape[ndim:], leaf.dtype) for leaf in leaves]
        #: each leaf's shape past its first dim (a row's), and its dtype
        self.row_specs = [(leaf.shape[1:], leaf.dtype) for leaf in leaves]
        # (lead dims, [(full shape, dtype) of every source leaf], [its full shape]) of the
        # last write: see expected_for
        self._expected: tuple[tuple[int, ...] | None, list[tuple[torch.Size, torch.dtype]],
                              list[torch.Size]] = (None, [], [])

    def expected_for(self, lead: tuple[int, ...]
                     ) -> tuple[list[tuple[torch.Size, torch.dtype]], list[torch.Size]]:
        """``([(shape, dtype) of every source leaf], [its shape])`` for a write whose leaves
        start with the dims ``lead``: ``lead`` + each leaf's own dims (kept for the last
        ``lead``: writes mostly repeat one batch size)."""
        cached_lead, expected, shapes = self._expected
        if cached_lead != lead:
            expected = [(torch.Size((*lead, *own)), dtype) for own, dtype in self.item_specs]
            shapes = [shape for shape, _ in expected]
            self._expected = (lead, expected, shapes)
        return expected, shapes

    def source_leaves(self, td: TensorDictBase, lead: tuple[int, ...],
                      leaves: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
        """Leaves of ``td`` in storage order, after checking keys and shapes.

        ``lead`` is the expected shape before each leaf's own dimensions (``[n, *inner]`` for
        ``n`` rows); ``leaves``: the leaves of ``td`` along the tree of keys
        (:func:`~._key_tree.leaves_along_tree`), if known.
        Raises ``KeyError`` naming missing / unexpected keys, ``ValueError``
        naming an entry of another shape, and what :func:`~tdreplay.storages._casts.check_cast`
        raises for an entry of another dtype whose cast would lose values. Data of the
        expected shapes and dtypes costs one comparison (the hot path).
        """
        out = leaves if leaves is not None else leaves_along_tree(td, self.tree, len(self.keys))
        if out is None:
            out = self.leaves_by_key(td)
        expected, _ = self.expected_for(lead)
        # one comparison on the hot path; the checks only where something differs
        if list(map(_SHAPE_DTYPE, out)) != expected:
            for key, src, (shape, dtype) in zip(self.keys, out, expected):
                check_source(key, src)
                if src.shape != shape:
                    raise ShapeMismatchError(  # (a ValueError, and TorchRL's RuntimeError)
                        f"{entry_label(key)} has shape {tuple(src.shape)}, expected "
                        f"{tuple(shape)} for this storage.")
                if src.dtype is not dtype:
                    check_cast(key, src, dtype)
        return out

    def leaves_by_key(self, td: TensorDictBase) -> list[torch.Tensor]:
        """Generic (slower) leaf lookup for any tensor collection; names mismatched keys."""
        keys = leaf_keys(td)
        for key in keys:  # a string entry is refused by name, not left behind
            if key not in self.key_set:
                check_source(key, td.get(key))
        if len(keys) != len(self.keys) or not all(k in self.key_set for k in keys):
            got = set(keys)
            missing = sorted(map(str, self.key_set - got))
            extra = sorted(map(str, got - self.key_set))
            raise KeyError(f"data keys do not match the storage: missing {missing}, unexpected "
                           f"{extra}.")
        return [td.get(key) for key in self.keys]

    def check_rows_compatible(self, data: TensorDictBase, rows: int, capacity: int) -> None:
        """Raise :class:`~tdreplay.core.CheckpointError` unless ``rows`` rows fit a storage of
        ``capacity`` rows and ``data`` has the layout's keys, row shapes (after the leading
        dimension) and dtypes."""
        if rows > capacity:
            raise CheckpointError(f"checkpoint holds {rows} rows, more than this storage's "
                                  f"{capacity}.")
        keys = set(leaf_keys(data))
        if keys != self.key_set:
            raise CheckpointError(
                f"checkpoint keys {sorted(map(str, keys))} differ from the storage keys "
                f"{sorted(map(str, self.key_set))}."
            )
        for key, (row_shape, dtype) in zip(self.keys, self.row_specs):
            src = data.get(key)
            if src.shape[1:] != row_shape:
                raise CheckpointError(f"checkpoint entry {key!r} has row shape "
                                      f"{tuple(src.shape[1:])}, the storage "
                                      f"{tuple(row_shape)}.")
            if src.dtype != dtype:
                raise CheckpointError(f"checkpoint entry {key!r} has dtype {src.dtype}, the "
                                      f"storage {dtype}.")
