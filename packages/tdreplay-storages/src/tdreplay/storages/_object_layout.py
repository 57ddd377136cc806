"""Non-tensor entries in a tensor storage's layout (no storage imports).

A :class:`~._layout.TensorLayout` holds tensors. Data with non-tensor entries (strings and
other JSON values as ``NonTensorData`` / ``NonTensorStack``: the prompts and answers of LLM
data, a tensorclass's ``str`` field) gets an :class:`ObjectLayout`: the same tensors, plus one
column of Python objects per non-tensor entry (a numpy object array shaped like the storage,
``[rows, *inner, *own batch dims]``). Writes check every value (:mod:`~._object_values`)
before anything is written; reads give what TorchRL's storages give (a ``NonTensorStack`` for a
batch, a ``NonTensorData`` for one item).

A layout without non-tensor entries stays a plain :class:`~._layout.TensorLayout`: the
factories here (:func:`first_layout`, :func:`wrapped_layout`, :func:`grown_layout`) build an
:class:`ObjectLayout` only for data that has such entries, so that the read and write paths of
tensor-only data are untouched (an :class:`ObjectLayout` declines
:meth:`~ObjectLayout.matching_leaves`, which sends its writes through
:meth:`~ObjectLayout.write`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from tensordict import NonTensorData, TensorDictBase

from tdreplay.core.checkpoint import CheckpointError
from tdreplay.core.utils import as_long_tensor

from ._layout import (
    Edit,
    NestedDims,
    NestedKey,
    TensorLayout,
    build_tree,
    key_path,
    leaf_keys,
    nested_batch_dims,
    tensordict_builder,
    with_new_entries,
)
from ._object_values import (
    entry_of,
    is_non_tensor,
    json_value,
    non_tensor_keys,
    values_of,
)
from ._row_writes import slice_bound
from ._tensorclasses import NestedClasses, nested_tensorclasses

__all__ = ["ObjectLayout", "first_layout", "grown_layout", "wrapped_layout"]


def _refuse(key: NestedKey, entry: Any, refusal: str | None) -> None:
    """``TypeError`` naming ``key`` when the storage keeps no non-tensor entries (``refusal``
    says why)."""
    if refusal is not None:
        raise TypeError(f"entry {key!r} is a {type(entry).__name__}: {refusal} (use "
                        "LazyTensorStorage, LazyStackStorage or ListStorage for non-tensor "
                        "entries).")


def _empty_column(shape: tuple[int, ...]) -> np.ndarray:
    return np.full(shape, None, dtype=object)


class ObjectLayout(TensorLayout):
    """A :class:`~._layout.TensorLayout` that keeps non-tensor entries beside its tensors.

    Parameters
    ----------
    td : TensorDictBase
        The tensors, as for :class:`~._layout.TensorLayout`.
    ndim : int
        Leading dimensions counted in the storage's capacity.
    device : torch.device
        Where the tensors live (the columns stay in this process's memory).
    columns : dict
        The column of each non-tensor entry: an object array of shape ``[rows, *inner,
        *own]`` (``own``: the entry's batch dims past the storage's).
    nested_dims : dict, optional
        The batch dims of nested levels past their parent's (of the whole data), for the
        levels that only non-tensor entries occupy.
    classes : dict, optional
        The tensorclasses nested in the data (see :class:`~._layout.TensorLayout`).

    Examples
    --------
    >>> from tensordict import NonTensorStack, TensorDict
    >>> td = TensorDict({"x": torch.zeros(4)}, [4])
    >>> layout = ObjectLayout(td, 1, torch.device("cpu"), {"t": _empty_column((4,))})
    >>> layout.write(slice(0, 2), TensorDict({"x": torch.ones(2), "t": NonTensorStack("a", "b")},
    ...                                      [2]), None, single=False)
    (2, 1)
    >>> out = layout.gather(torch.tensor([1, 0, 1]))
    >>> out["t"], out["x"].tolist()
    (LinkedList(['b', 'a', 'b']), [1.0, 1.0, 1.0])
    """

    def __init__(self, td: TensorDictBase, ndim: int, device: torch.device,
                 columns: dict[NestedKey, np.ndarray],
                 nested_dims: NestedDims | None = None,
                 classes: NestedClasses | None = None) -> None:
        #: the column of each non-tensor entry (object arrays ``[rows, *inner, *own]``)
        self.objects = dict(columns)
        self.object_keys = sorted(self.objects, key=str)
        self.object_key_set = frozenset(self.objects)
        self.object_nested_dims: NestedDims = dict(nested_dims or {})
        super().__init__(td, ndim, device, classes)  # (its _view_leaves reads the columns' keys)

    def _view_leaves(self, batch_size: torch.Size) -> None:
        super()._view_leaves(batch_size)
        # builds the TensorDicts read: the tensors, then the non-tensor entries (unchecked:
        # tensordict's checked ``set`` moves a stack to the device value by value)
        tree = build_tree([*self.keys, *self.object_keys])
        nested = {**self.object_nested_dims, **self.nested_dims}
        self._build_all = tensordict_builder(tree, self.device, nested_dims=nested,
                                             classes=self.nested_classes,
                                             item_names=self.item_names)
        # (the rows as plain TensorDicts, what checkpointers save: see rows_view)
        self._build_plain = (tensordict_builder(tree, self.device, nested_dims=nested,
                                                item_names=self.item_names)
                             if self.nested_classes else self._build_all)

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        del state["_build_all"], state["_build_plain"]  # (made again with the views)
        return state

    # ---- shapes --------------------------------------------------------------------------------
    def _own(self, key: NestedKey) -> tuple[int, ...]:
        """The dims of entry ``key`` past the storage's ``[rows, *inner]``."""
        return tuple(self.objects[key].shape[self.ndim:])

    def _by_element(self, key: NestedKey) -> np.ndarray:
        """Column ``key`` with one leading dim per element of the storage's TensorDict (rows,
        inner and item batch dims flattened): what :meth:`_element_ids` index."""
        column = self.objects[key]
        batch = len(self.td.batch_size)
        return column.reshape((math.prod(column.shape[:batch]), *column.shape[batch:]))

    def _element_ids(self, rows: int, index: Any) -> torch.Tensor:
        """The flat element ids ``index`` selects in the first ``rows`` rows (of the shape
        TensorDict indexing gives the selection), or what indexing raises."""
        rest = self.td.batch_size[1:]
        ids = torch.arange(rows * math.prod(rest), device=self.device).view(rows, *rest)
        return ids if index is None else ids[index]

    # ---- writes --------------------------------------------------------------------------------
    def _values_for(self, td: TensorDictBase, lead: tuple[int, ...]) -> dict[NestedKey, Any]:
        """Every non-tensor entry of ``td`` (data written with the leading dims ``lead``) as
        checked values: ``KeyError`` for one missing, what :func:`values_of` raises else."""
        entries = {key: td.get(key, None) for key in self.object_keys}
        missing = [str(key) for key, entry in entries.items() if entry is None]
        if missing:
            raise KeyError(f"data keys do not match the storage: missing {sorted(missing)}, "
                           "unexpected [].")
        return {key: values_of(key, entry, (*lead, *self._own(key)))
                for key, entry in entries.items()}

    def matching_leaves(self, td: TensorDictBase) -> list[torch.Tensor] | None:
        """``None``: every write takes :meth:`write`'s path (which writes the columns too)."""
        return None

    def write(self, rows: Any, td: TensorDictBase, leaves: list[torch.Tensor] | None,
              single: bool, written: int | None = None) -> tuple[int | None, int | None]:
        """:meth:`~._layout.TensorLayout.write` of the tensors and the non-tensor entries of
        ``td``, every value checked before anything is written."""
        cap = self.rows
        base = cap if written is None else written
        if single:
            lead: tuple[int, ...] = tuple(self.inner)
            where: Any = None
        elif isinstance(rows, slice):
            where = range(*rows.indices(slice_bound(rows, cap, base)))
            lead = (len(where), *self.inner)
        else:
            where = as_long_tensor(rows, name="rows").reshape(-1)
            lead = (where.numel(), *self.inner)
        values = self._values_for(td, lead)
        tensors = td.exclude(*self.object_keys)
        top, last = super().write(rows, tensors, TensorLayout.matching_leaves(self, tensors),
                                  single, written)
        if single:  # (rows checked by the tensor write; negative ones count from ``base``)
            row = int(rows) + base if int(rows) < 0 else int(rows)
            for key, new in values.items():
                self.objects[key][row:row + 1] = new[None]
        elif isinstance(where, range) and where.step == 1:
            for key, new in values.items():
                self.objects[key][where.start:where.stop] = new
        else:
            index = (torch.tensor(list(where), dtype=torch.long) if isinstance(where, range)
                     else where)
            index = torch.where(index < 0, index + base, index).cpu().numpy()
            for key, new in values.items():
                self.objects[key][index] = new
        return top, last

    def index_edit(self, rows: int, index: Any, td: TensorDictBase) -> Edit:
        ids = self._element_ids(rows, index)
        values = self._values_for(td, tuple(ids.shape))
        tensors = super().index_edit(rows, index, td.exclude(*self.object_keys))
        flat_ids = ids.reshape(-1).cpu().numpy()

        def write() -> None:
            tensors.write()
            for key, new in values.items():
                self._by_element(key)[flat_ids] = new.reshape((len(flat_ids),
                                                               *new.shape[ids.ndim:]))

        return Edit(tensors.keys, index, write)

    def install_rows(self, rows: int, data: TensorDictBase) -> None:
        values = {key: values_of(key, data.get(key), (rows, *self.objects[key].shape[1:]))
                  for key in self.object_keys}
        super().install_rows(rows, data.exclude(*self.object_keys))
        for key, new in values.items():
            self.objects[key][:rows] = new

    def _set_values(self, key: NestedKey, value: Any, ids: torch.Tensor) -> Callable[[], None]:
        """The write of ``value`` (a ``NonTensorStack`` of the selection's shape, or one value
        for all: a ``NonTensorData`` or a JSON value) into entry ``key`` at element ``ids``,
        checked; returned to be run."""
        extra = self._by_element(key).shape[1:]
        shape = (*ids.shape, *extra)
        if is_non_tensor(value) and not isinstance(value, NonTensorData):
            new = values_of(key, value, shape)
        else:
            new = np.empty(shape, dtype=object)
            new.fill(json_value(key, value.data if isinstance(value, NonTensorData) else value))
        flat_ids = ids.reshape(-1).cpu().numpy()

        def commit() -> None:
            self._by_element(key)[flat_ids] = new.reshape((len(flat_ids), *extra))

        return commit

    def entry_edit(self, key: NestedKey, value: Any, rows: int, index: Any = None) -> Edit:
        """:meth:`~._layout.TensorLayout.entry_edit`; for a non-tensor entry ``value`` is a
        ``NonTensorStack`` of the selection's shape, or one value for every element selected
        (a ``NonTensorData`` or a JSON value)."""
        if key not in self.object_key_set:
            return super().entry_edit(key, value, rows, index)
        try:
            ids = self._element_ids(rows, index)
        except (RuntimeError, IndexError) as err:
            where = "the written rows" if index is None else f"index {index!r}"
            raise ValueError(f"{where} of key {key!r} is not within the {rows} written rows: "
                             f"{err}") from err
        return Edit((), index, self._set_values(key, value, ids))

    def object_updates(self, data: TensorDictBase, rows: int,
                       keys_to_update: Any = None) -> Callable[[], None] | None:
        """The writes ``update_`` makes into the non-tensor entries ``data`` has (and
        ``keys_to_update`` names), each checked; entries ``data`` lacks are left."""
        chosen = None if keys_to_update is None else [key_path(k) for k in keys_to_update]
        ids = self._element_ids(rows, None)
        commits = []
        for key in self.object_keys:
            value = data.get(key, None)
            path = key_path(key)
            if value is None or (chosen is not None
                                 and not any(path[:len(c)] == c for c in chosen)):
                continue
            commits.append(self._set_values(key, value, ids))

        def commit() -> None:
            for one in commits:
                one()

        return commit

    # ---- reads ---------------------------------------------------------------------------------
    def _entries(self, ids: np.ndarray, shape: tuple[int, ...],
                 columns: Callable[[NestedKey], np.ndarray]) -> list[Any]:
        """Each non-tensor entry read: ``columns(key)`` (one leading dim) at flat ``ids``, as
        an entry of ``shape`` and its own dims."""
        out = []
        for key in self.object_keys:
            column = columns(key)
            out.append(entry_of(column[ids].reshape((*shape, *column.shape[1:])), copies=True))
        return out

    def _by_slot(self, key: NestedKey) -> np.ndarray:
        column = self.objects[key]
        return column.reshape((self.rows * self.row_numel, *column.shape[self.ndim:]))

    def gather(self, slots: torch.Tensor) -> TensorDictBase:
        if slots.device != self.device:
            slots = slots.to(self.device)
        shape = slots.shape
        flat = slots.reshape(-1)
        leaves = [rows.reshape(shape + rows.shape[1:]) for rows in self.host_rows.take(flat)]
        entries = self._entries(flat.cpu().numpy(), tuple(shape), self._by_slot)
        return self._build_all(leaves + entries, shape + self.item_batch)

    def _rebuilt(self, td: TensorDictBase, ids: torch.Tensor,
                 columns: Callable[[NestedKey], np.ndarray], plain: bool = False
                 ) -> TensorDictBase:
        """``td`` (the tensors of the elements ``ids``) rebuilt with the non-tensor entries
        (with the nested tensorclasses, unless ``plain``)."""
        leaves = [td.get(key) for key in self.keys]
        entries = self._entries(ids.reshape(-1).cpu().numpy(), tuple(ids.shape), columns)
        build = self._build_plain if plain else self._build_all
        return build(leaves + entries, td.batch_size)

    def read_index(self, rows: int, index: Any) -> Any:
        out = self._read_rows(rows, index)  # (the builder below makes the tensorclasses)
        if not isinstance(out, TensorDictBase):
            return out
        return self._rebuilt(out, self._element_ids(rows, index), self._by_element)

    def rows_view(self, rows: int) -> TensorDictBase:
        """The first ``rows`` rows: a view of the tensors, and each non-tensor entry as a
        ``NonTensorStack`` of its values (a copy: write them with ``set``/``set_key``)."""
        return self._rebuilt(super().rows_view(rows), self._element_ids(rows, None),
                             self._by_element, plain=True)

    # ---- checks --------------------------------------------------------------------------------
    def check_rows_compatible(self, data: TensorDictBase, rows: int) -> None:
        keys = set(leaf_keys(data))
        expected = self.key_set | self.object_key_set
        if keys != expected:
            raise CheckpointError(f"checkpoint keys {sorted(map(str, keys))} differ from the "
                                  f"storage keys {sorted(map(str, expected))}.")
        super().check_rows_compatible(data.exclude(*self.object_keys), rows)
        for key in self.object_keys:
            try:
                values_of(key, data.get(key), (rows, *self.objects[key].shape[1:]))
            except (TypeError, ValueError) as err:
                raise CheckpointError(f"checkpoint {err}") from err

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(shape={tuple(self.shape)}, keys={self.keys}, "
                f"object_keys={self.object_keys})")


def _checked_entries(td: TensorDictBase, keys: list[NestedKey], refusal: str | None) -> None:
    """Refuse the non-tensor entries ``keys`` of ``td`` (``refusal``) or check their values."""
    for key in keys:
        entry = td.get(key)
        _refuse(key, entry, refusal)
        values_of(key, entry, tuple(entry.batch_size))


def first_layout(td: TensorDictBase, shape: torch.Size, skip: int,
                 allocate: Callable[[torch.Size, torch.dtype, NestedKey], torch.Tensor],
                 ndim: int, device: torch.device, refusal: str | None,
                 classes: NestedClasses | None = None) -> TensorLayout:
    """:meth:`TensorLayout.allocate <._layout.TensorLayout.allocate>` for data ``td`` that
    may have non-tensor entries (then an :class:`ObjectLayout`, with empty columns); their
    values are checked first, or they are refused (``TypeError``) when ``refusal`` (why the
    storage keeps none) is given. Nothing is allocated before the checks. ``classes``: the
    tensorclasses nested in the data (``None``: those of ``td``).

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> td = TensorDict({"x": torch.zeros(2), "t": NonTensorData("a", batch_size=[2])}, [2])
    >>> layout = first_layout(td, torch.Size([5]), 1, lambda s, d, k: torch.zeros(s, dtype=d),
    ...                       1, torch.device("cpu"), None)
    >>> type(layout).__name__, layout.keys, layout.object_keys
    ('ObjectLayout', ['x'], ['t'])
    >>> first_layout(td, torch.Size([5]), 1, None, 1, torch.device("cpu"), "not here")
    Traceback (most recent call last):
    ...
    TypeError: entry 't' is a NonTensorData: not here (use LazyTensorStorage, ...
    """
    if classes is None:
        classes = nested_tensorclasses(td)
    keys = non_tensor_keys(td)
    if not keys:
        return TensorLayout.allocate(td, shape, skip, allocate, ndim, device, classes)
    _checked_entries(td, keys, refusal)
    base = TensorLayout.allocate(td.exclude(*keys), shape, skip, allocate, ndim, device, classes)
    columns = {key: _empty_column((*shape, *td.get(key).batch_size[skip:])) for key in keys}
    return ObjectLayout(base.td, ndim, device, columns, nested_batch_dims(td), classes)


def wrapped_layout(td: TensorDictBase, ndim: int, device: torch.device,
                   refusal: str | None, classes: NestedClasses | None = None) -> TensorLayout:
    """The layout of existing data ``td`` a storage wraps (every row written): an
    :class:`ObjectLayout` holding copies of its non-tensor values when it has some (checked,
    or refused as :func:`first_layout` refuses them). ``classes``: the tensorclasses nested
    in the data (``None``: those of ``td``).

    Examples
    --------
    >>> from tensordict import NonTensorStack, TensorDict
    >>> td = TensorDict({"x": torch.zeros(2), "t": NonTensorStack("a", "b")}, [2])
    >>> wrapped_layout(td, 1, torch.device("cpu"), None).objects["t"].tolist()
    ['a', 'b']
    """
    if classes is None:
        classes = nested_tensorclasses(td)
    keys = non_tensor_keys(td)
    if not keys:
        return TensorLayout(td, ndim, device, classes)
    _checked_entries(td, keys, refusal)
    base = TensorLayout(td.exclude(*keys), ndim, device, classes)
    columns = {key: values_of(key, td.get(key), tuple(td.get(key).batch_size)) for key in keys}
    return ObjectLayout(base.td, ndim, device, columns, nested_batch_dims(td), classes)


def grown_layout(layout: TensorLayout, td: TensorDictBase, allocate: Any, skip: int,
                 device: torch.device, refusal: str | None,
                 classes: NestedClasses | None = None) -> TensorLayout:
    """:func:`~._layout.with_new_entries` for data ``td`` that may have non-tensor entries:
    ``layout`` with the entries of ``td`` it lacks (a new non-tensor entry gets a column of
    ``None`` for the rows written before), or ``layout`` itself (see
    :func:`~._layout.with_new_entries`, which ``classes`` goes to).

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> layout = TensorLayout(TensorDict({"x": torch.zeros(3)}, [3]), 1, torch.device("cpu"))
    >>> td = TensorDict({"x": torch.ones(1), "t": NonTensorData("a", batch_size=[1])}, [1])
    >>> grown = grown_layout(layout, td, None, 1, torch.device("cpu"), None)
    >>> grown.objects["t"].tolist(), grown.leaves[0] is layout.leaves[0]
    ([None, None, None], True)
    """
    known = layout.key_set | layout.object_key_set
    keys = leaf_keys(td)
    new = [key for key in keys if key not in known]
    if not new or not known <= set(keys):
        return layout
    new_objects = [key for key in new if is_non_tensor(td.get(key))]
    if not new_objects and not layout.object_key_set:  # tensors alone, as before
        return with_new_entries(layout, td, allocate, skip, device, classes)
    _checked_entries(td, new_objects, refusal)
    if classes is None:
        classes = nested_tensorclasses(td)
    tensors = td.exclude(*layout.object_key_set, *new_objects)
    grown = with_new_entries(layout, tensors, allocate, skip, device, classes)
    columns = dict(layout.objects) if isinstance(layout, ObjectLayout) else {}
    for key in new_objects:
        columns[key] = _empty_column((*layout.shape, *td.get(key).batch_size[skip:]))
    nested = {**nested_batch_dims(td)}
    if isinstance(layout, ObjectLayout):
        nested = {**nested, **layout.object_nested_dims}
    out = ObjectLayout(grown.td, layout.ndim, device, columns, nested, grown.nested_classes)
    out.unfilled_from = grown.unfilled_from
    return out
