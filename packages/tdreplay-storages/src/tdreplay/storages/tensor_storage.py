"""Contiguous tensor storages: :class:`TensorStorage` and :class:`LazyTensorStorage`.

Data of any supported kind (TensorDict, tensor, tensorclass, pytree of tensors) is kept as a
TensorDict of preallocated leaves with batch shape ``[rows, *inner]`` (a
:class:`~tdreplay.storages._layout.TensorLayout`). The hot paths (``set`` of a contiguous block,
``get`` of sampled slots) work on the leaf tensors directly (one ``copy_`` / ``index_select``
per leaf) and build the output TensorDict without the generic TensorDict indexing machinery.

Where the layout and the number of written rows live is up to a subclass: the base keeps them
in the object, :class:`~tdreplay.storages.LazyMemmapStorage` in files shared by processes (it
overrides :meth:`TensorStorage._current_layout`, ``_rows_written`` and ``_set_rows_written``,
whose base keeps the count in the object: :mod:`~tdreplay.storages._compilable_rows`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase, is_tensor_collection

from tdreplay.core import Storage, StorageCheckpointerBase
from tdreplay.core.storage import written_slots
from tdreplay.core.utils import (
    ShapeMismatchError,
    as_long_tensor,
    check_flag,
    clone_exact,
    is_int,
)

from ._allocation import allocate_unfilled
from ._casts import is_number
from ._checkpoint_rows import CheckpointRowsMixin
from ._compilable_rows import CompilableRows
from ._consolidation import check_consolidable
from ._entry_edits import NO_GUARD, EditGuard
from ._formats import KIND_PYTREE, KIND_TC, KIND_TENSOR, DataFormat, to_tensordict
from ._index_values import (
    flattened_for_index,
    format_index,
    number_value,
    plain_at_index,
)
from ._index_writes import IndexWritesMixin
from ._keys import is_key_index
from ._layout import TensorLayout, checked_updates
from ._object_layout import first_layout, grown_layout, wrapped_layout
from ._row_gaps import check_no_gap
from ._source_checks import check_storable_leaves
from ._state_checks import check_tensor_state
from ._tensorclasses import NestedClasses, classes_of
from .checkpointers import TensorStorageCheckpointer

__all__ = ["LazyTensorStorage", "TensorStorage", "TensorStorageCheckpointer"]


def _wrapped(storage: Any, max_size: int | None,
             ndim: int) -> tuple[int, TensorDictBase, DataFormat, NestedClasses]:
    """``(max_size, td, format, nested tensorclasses)`` of existing data a
    :class:`TensorStorage` wraps."""
    td, kind, extra = to_tensordict(storage, batched=True, ndim=ndim)
    if td.batch_dims < ndim:
        raise ValueError(f"storage has {td.batch_dims} batch dims, fewer than ndim={ndim}.")
    slots = math.prod(td.batch_size[:ndim])
    if max_size is not None and max_size != slots:
        raise ValueError(f"The max-size and the storage shape mismatch: max_size={max_size}, "
                         f"but the storage passed has {slots} slots (batch shape "
                         f"{tuple(td.batch_size[:ndim])}).")
    return slots, td, DataFormat(kind, extra), classes_of(storage, td, kind)


def _check_index_dtype(index: Any) -> None:
    """``TypeError`` naming ``index`` for a tensor or array index of floats (a read took
    ``1.7`` for row 1) or of ``uint8`` (torch reads it as a mask, a write took it for rows),
    also as a part of a tuple index; an empty one selects nothing and passes.

    Examples
    --------
    >>> _check_index_dtype(torch.tensor([0, 2]))
    >>> _check_index_dtype(np.array([1.7]))
    Traceback (most recent call last):
    ...
    TypeError: index must hold int rows or be a bool mask, got float64 values.
    """
    if type(index) is tuple:  # (an index per dim of a multi-dim storage)
        for part in index:
            _check_index_dtype(part)
        return
    dtype = getattr(index, "dtype", None)
    if dtype is None or not isinstance(index, (torch.Tensor, np.ndarray)):
        return
    if isinstance(index, np.ndarray):
        bad = index.size > 0 and (dtype.kind not in "biu" or dtype == np.uint8)
    else:  # (an empty index selects nothing, whatever its dtype: numpy's is float64)
        bad = index.numel() > 0 and (index.is_floating_point() or index.is_complex()
                                     or dtype is torch.uint8)
    if bad:
        name = str(dtype).replace("torch.", "")
        raise TypeError(f"index must hold int rows or be a bool mask, got {name} values.")


def _rows_for(inner: Sequence[int], max_size: int) -> int:
    """Row capacity of ``max_size`` slots in rows of shape ``inner``."""
    rows = max_size // max(math.prod(inner), 1)
    if rows < 1:
        raise ValueError(f"max_size={max_size} is smaller than one row of "
                         f"{math.prod(inner)} slots (inner shape {tuple(inner)}).")
    return rows


def _rows_for_data(data: Any, batched: bool, ndim: int, max_size: int) -> int:
    """Rows of a storage laid out for ``data``, its first write."""
    td, _, _ = to_tensordict(data, batched=batched, ndim=ndim)
    lead = int(batched)
    return _rows_for(td.batch_size[lead: lead + ndim - 1], max_size)


def _slots_of_rows(layout: TensorLayout, rows: torch.Tensor) -> torch.Tensor:
    """Flat slots of ``rows`` in a storage laid out as ``layout``, of several slots a row."""
    numel = layout.row_numel
    return (rows.reshape(rows.shape + (1,)) * numel
            + torch.arange(numel, device=rows.device)).reshape(rows.shape + layout.inner)


class TensorStorage(CheckpointRowsMixin, CompilableRows, IndexWritesMixin, Storage):
    """A storage over preallocated tensors (a TensorDict, a tensor, a tensorclass or a pytree).

    Parameters
    ----------
    storage : TensorDict, Tensor, tensorclass or pytree of tensors, optional
        Existing data to wrap; its leading ``ndim`` dimensions are the capacity and it counts as
        fully written (datasets use this). ``None`` for a lazy storage laid out on first write.
    max_size : int, optional
        Capacity in slots; defaults to the number of slots of ``storage``.
    device : str or torch.device
        Where lazily created data lives. Defaults to ``"cpu"``.
    ndim : int
        How many leading dimensions count towards the capacity. With ``ndim=2`` and data of
        batch shape ``[B, T]``, the storage has shape ``[max_size // T, T]`` and ``extend``
        writes ``B`` rows of ``T`` steps.
    compilable : bool
        As TorchRL: ``True`` keeps the count of written rows in a 0-dim tensor
        (:meth:`written_slots_tensor`) and writes batches at tensor rows without reading them
        back as ints, so that a ``torch.compile``'d ``extend`` + ``sample`` stops recompiling
        once warmed up. Same data and ``state_dict`` either way.

    Notes
    -----
    A tensorclass nested in the data (``td["obs"]`` an ``Obs``, at any depth, also in a field
    of a tensorclass) reads back as that class, as TorchRL's; ``state_dict`` and checkpoints
    record it by name (see :meth:`layout_meta`). A later write may hold a TensorDict there
    (read back as the class, as TorchRL reads it); another tensorclass there, or a
    tensorclass where the storage holds a TensorDict, is refused (``TypeError`` naming the
    entry): its rows would read back as another class.

    The names of an item's own batch dims (TensorDict ``names``, e.g. ``[None, "time"]`` for
    ``[B, T]`` data) are kept from the first write and given back by reads, as TorchRL's; the
    storage's own dims are unnamed.

    Examples
    --------
    >>> from tensordict import TensorDict, tensorclass
    >>> s = TensorStorage(TensorDict({"x": torch.arange(4)}, [4]))
    >>> len(s), s.get(torch.tensor([3, 1]))["x"].tolist()
    (4, [3, 1])
    >>> @tensorclass
    ... class Obs:
    ...     pos: torch.Tensor
    >>> @tensorclass
    ... class Other:
    ...     pos: torch.Tensor
    >>> s = LazyTensorStorage(10)
    >>> s.set(slice(0, 2), TensorDict(obs=Obs(pos=torch.zeros(2), batch_size=[2]),
    ...                               batch_size=[2]))
    >>> type(s.get(torch.tensor([1]))["obs"]).__name__
    'Obs'
    >>> s.set(slice(2, 4), TensorDict(obs=Other(pos=torch.ones(2), batch_size=[2]),
    ...                               batch_size=[2]))
    Traceback (most recent call last):
    ...
    TypeError: entry 'obs' is tensorclass Other, but this storage holds Obs there: ...
    """

    _default_checkpointer = TensorStorageCheckpointer
    supports_conditional_update = True  # entries patched in place (update_if_present)
    adds_entries = True  #: data with a new key adds its entry (zero-filled), as TorchRL's
    #: first layout allocated unfilled (see ``_row_writes.before_write``); False: _allocate's
    _lays_out_unfilled: bool = True
    #: why the storage keeps no non-tensor entries (``None``: it keeps them, as JSON values in
    #: columns beside its tensors: :mod:`~tdreplay.storages._object_layout`)
    non_tensor_refusal: str | None = None
    #: whether the storage's TensorDict is consolidated when it is laid out (see
    #: :class:`LazyTensorStorage`'s ``consolidated``)
    consolidated: bool = False
    #: whether ``consolidated`` takes effect (not where the leaves are files other processes map)
    _consolidates: bool = True

    def __init__(
        self,
        storage: Any = None,
        max_size: int | None = None,
        *,
        device: str | torch.device = "cpu",
        ndim: int = 1,
        checkpointer: StorageCheckpointerBase | None = None,
        compilable: bool = False,
    ) -> None:
        if not isinstance(ndim, int) or isinstance(ndim, bool) or ndim < 1:
            raise ValueError(f"ndim must be a positive int, got {ndim!r}.")
        wrapped = None if storage is None else _wrapped(storage, max_size, ndim)
        max_size = wrapped[0] if wrapped is not None else max_size
        if max_size is None:
            raise ValueError("Expected storage to be non-null, or max_size to be given (the "
                             "number of rows to allocate lazily).")
        super().__init__(max_size, checkpointer, compilable=compilable)
        self.ndim = ndim
        self._device = torch.device(device) if device is not None else torch.device("cpu")
        self._count_in_tensor(self.compilable)
        self._layout: TensorLayout | None = None
        self._format = DataFormat()
        if wrapped is not None:
            _, td, self._format, classes = wrapped
            check_storable_leaves(td)
            self._layout = wrapped_layout(td, self.ndim, self._device, self.non_tensor_refusal,
                                          classes)
            self._set_rows_written(self._layout.rows)

    # ---- where the layout and the row count live (subclasses may keep them elsewhere) -----------
    def _current_layout(self) -> TensorLayout | None:
        """The storage's tensors, ``None`` before a lazy storage's first write (a subclass whose
        layout can be made elsewhere, by another process, attaches it here when it appears)."""
        return self._layout

    # ---- layout ----------------------------------------------------------------------------------
    @property
    def initialized(self) -> bool:
        return self._current_layout() is not None

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def shape(self) -> torch.Size | None:
        """Storage shape ``[rows, *inner]`` (``None`` before a lazy storage's first write)."""
        layout = self._current_layout()
        return None if layout is None else layout.shape

    @property
    def rows_capacity(self) -> int | None:
        layout = self._current_layout()
        return None if layout is None else layout.rows

    @property
    def row_numel(self) -> int:
        layout = self._current_layout()
        return 1 if layout is None else layout.row_numel

    @property
    def rows_written(self) -> int:
        return self._rows_written()  # (0 before the layout: nothing written)

    def rows_capacity_for(self, data: Any, batched: bool) -> int:
        layout = self._current_layout()
        if layout is not None:
            return layout.rows
        return _rows_for_data(data, batched, self.ndim, self.max_size)

    def rows_to_slots(self, rows: torch.Tensor) -> torch.Tensor:
        layout = self._current_layout()
        if layout is None or not layout.inner:  # ndim=1: one slot a row
            return rows
        return _slots_of_rows(layout, rows)

    def _create(self, td: TensorDictBase, batched: bool,
                classes: NestedClasses | None = None) -> None:
        """Lay out the storage from the first data written (one item or a batch); ``classes``:
        the tensorclasses nested in it (``None``: those of ``td``)."""
        lead = int(batched)
        if td.batch_dims < lead + self.ndim - 1:
            raise ShapeMismatchError(  # (a ValueError, and TorchRL's RuntimeError)
                f"data has {td.batch_dims} batch dims; a storage with ndim={self.ndim} "
                f"needs at least {lead + self.ndim - 1}{' (several rows: one a row)' * lead}.")
        inner = td.batch_size[lead: lead + self.ndim - 1]
        shape = torch.Size([self.rows_capacity_for(td, batched), *inner])
        # compilable: zero-filled, so that writes need no check of the unfilled rows
        unfilled = self._lays_out_unfilled and self._len_tensor is None
        device = self._device
        allocate = (lambda size, dtype, key: allocate_unfilled(size, dtype, device)) \
            if unfilled else self._allocate

        def allocate_named(size: torch.Size, dtype: torch.dtype, key: Any) -> torch.Tensor:
            try:
                return allocate(size, dtype, key)
            except (ValueError, OverflowError, MemoryError, RuntimeError) as err:
                if isinstance(err, torch.OutOfMemoryError):  # (what device code catches)
                    raise
                # (torch's "Maximum allowed dimension exceeded" / "int too large" / host out
                # of memory name neither the argument nor the entry)
                raise MemoryError(
                    f"{type(self).__name__}(max_size={self.max_size}): cannot allocate entry "
                    f"{key!r} of shape {tuple(size)} and dtype {dtype}: {err}") from err

        self._layout = first_layout(td, shape, lead + len(inner), allocate_named, self.ndim,
                                    device, self.non_tensor_refusal, classes)
        self._layout.unfilled_from = 0 if unfilled else None  # no row written yet
        if self.consolidated and self._consolidates:
            self._layout.consolidate()  # (kind checked before: see _check_consolidable)
        self._set_rows_written(0)

    def _check_consolidable(self, kind: str) -> None:
        """``ValueError`` when this storage consolidates and cannot hold data of ``kind``."""
        if self.consolidated and self._consolidates:
            check_consolidable(kind)

    def _allocate(self, shape: torch.Size, dtype: torch.dtype, key: Any = None) -> torch.Tensor:
        """Allocate the leaf of entry ``key``, zero-filled (memory-mapped storages override
        this; an entry added to written rows needs zeros)."""
        return torch.zeros(shape, dtype=dtype, device=self._device)

    # ---- writing ---------------------------------------------------------------------------------
    def set(self, cursor: int | slice | torch.Tensor | Sequence[int], data: Any, *,
            set_cursor: bool = True) -> None:
        if isinstance(cursor, torch.Tensor):  # (one check on extend's path: a slice)
            if cursor.dtype is torch.bool:  # a mask of the written rows (or of every row),
                # as get reads it: those it marks
                cursor = written_slots(cursor, self._rows_written(), self.rows_capacity)
            elif type(cursor) is torch.Tensor and cursor.dtype is torch.uint8:
                _check_index_dtype(cursor)  # (rows, never a mask: refused as reads refuse it)
        if is_number(data):  # into a storage of tensors, broadcast as torch's t[0] = 3.0
            data = self._number_rows(cursor, data, "data")
        if set_cursor is not True and set_cursor is not False:  # (one check when a bool)
            check_flag(set_cursor, "set_cursor")
        if self._len_tensor is not None and self._set_compiled(cursor, data, set_cursor):
            return
        single = type(cursor) is int or (type(cursor) is not slice and is_int(cursor))
        td, kind, extra = to_tensordict(data, batched=not single, ndim=self.ndim)
        layout = self._current_layout()
        written = self._rows_written()
        # rows past the written ones leaving a gap: refused (it would count as data). None
        # in a full storage, nor in rows appended after the written ones (extend's slice)
        if layout is None or written < layout.rows and not (
                type(cursor) is slice and cursor.start == written and cursor.step is None):
            lead = int(not single)
            cap = layout.rows if layout is not None else _rows_for(
                td.batch_size[lead: lead + self.ndim - 1], self.max_size)
            check_no_gap(cursor, single, written, cap, type(self).__name__)
        leaves = None
        if layout is None:
            self._check_consolidable(kind)  # (before anything changes)
            check_storable_leaves(td)
            self._format = DataFormat(kind, extra)
            self._create(td, batched=not single, classes=classes_of(data, td, kind))
            layout = self._current_layout()
            assert layout is not None
        else:
            fmt = self._format
            if kind != fmt.kind or (extra is not None and extra != fmt.extra):
                fmt.check_same(kind, extra)
            leaves = layout.matching_leaves(td)  # None: other keys (or not a plain TensorDict)
            # plain TensorDicts at every level (leaves found) hold no tensorclass, nor does a
            # tensorclass laid out without nested levels: the hot paths check nothing more
            if leaves is None or (kind == KIND_TC and layout.has_levels):
                classes = classes_of(data, td, kind)
                layout.check_classes(classes)  # (refused: another class would read back)
            if leaves is None and self.adds_entries:
                grown = grown_layout(layout, td, self._allocate, int(not single) + self.ndim - 1,
                                     self._device, self.non_tensor_refusal, classes)
                if grown is not layout:  # a new key: its entry is added, zero-filled (TorchRL)
                    self._layout = grown
                    try:
                        return self.set(cursor, data, set_cursor=set_cursor)
                    except BaseException:
                        self._layout = layout  # a refused write adds nothing
                        raise
        # (``written``, read above, holds: a first layout counts 0 rows, as before it)
        top, last = layout.write(cursor, td, leaves, single, written)  # (-1: last written row)
        if top is not None and top > written:  # (a full buffer: no update)
            self._set_rows_written(top)
        if last is not None and set_cursor:
            self.last_written_row = last

    def __setitem__(self, index: Any, value: Any) -> None:
        _check_index_dtype(index)
        layout = self._current_layout()
        if is_number(value):  # (checked here to name ``value``; set expands it over the rows)
            number = number_value(layout, self._format.kind, value, "value")
            if isinstance(index, tuple):
                value = number  # (0-dim: broadcast as plain data over what index selects)
        if isinstance(index, tuple) and layout is not None:
            if self.ndim > 1:
                self._check_index_range(index, f"storage[{format_index(index)}] = ...")
            # a tensor or pytree takes the batch shape of what index selects (as it reads)
            plain = not is_tensor_collection(value)
            td, kind, extra = to_tensordict(value, batched=not plain,
                                            ndim=1 if plain else self.ndim)
            fmt = self._format
            if (plain or fmt.kind in (KIND_TENSOR, KIND_PYTREE)) and (
                    kind != fmt.kind or (extra is not None and extra != fmt.extra)):
                fmt.check_same(kind, extra)  # (another kind of data: named)
            classes = classes_of(value, td, kind)
            layout.check_classes(classes)
            with self._edit_guard() as guard:
                rows = self._rows_written()
                if plain:
                    td = plain_at_index(layout, rows, index, td)
                    target = layout
                else:  # a new key: its entry is added, zero-filled, once the edit is checked
                    target = self._grown_for_index(layout, td, kind, classes)
                edit = target.index_edit(rows, index, td)  # (every entry checked)
                guard.record(target.td, edit.keys, index, rows)
                if target is layout:
                    edit.write()
                    return
                self._layout = target
                try:
                    edit.write()
                except BaseException:
                    self._layout = layout  # (an entry added by a write that failed: dropped)
                    raise
            return
        # a value of a multi-dim tensor of rows is shaped as it reads: [*index.shape, ...]
        super().__setitem__(index, flattened_for_index(index, value))

    # ---- reading ---------------------------------------------------------------------------------
    def get(self, index: int | torch.Tensor) -> Any:
        layout = self._current_layout()
        if layout is None:
            raise RuntimeError("cannot read from a storage that was never written.")
        if type(index) is not torch.Tensor or index.dtype is not torch.long:
            if type(index) is tuple:  # coordinates in the storage's dims, as storage[index]
                # (TorchRL's get): (0, 1) is row 0, column 1 of an ndim=2 storage; (1,) row 1
                _check_index_dtype(index)  # (float or uint8 parts: TypeError, as storage[i])
                try:
                    read = layout.read_index(self._rows_written(), index)
                except IndexError:
                    if self.ndim > 1:  # (the dim out of range named in the storage's layout)
                        self._check_index_range(index, f"get(({format_index(index)},))"
                                                if len(index) == 1 else f"get({index!r})")
                    raise
                return self._format.from_td(clone_exact(read))
            dtype = getattr(index, "dtype", None)
            if dtype is torch.uint8 or (isinstance(dtype, np.dtype) and dtype == np.uint8):
                # torch reads it as a mask, a write as rows: TypeError, as storage[i] (floats:
                # written_slots names them)
                _check_index_dtype(index)
        if type(index) is not torch.Tensor or index.ndim == 0:
            if is_int(index):
                index = torch.tensor(int(index))
            elif isinstance(index, slice):  # of the written slots, as TorchRL's get
                index = torch.arange(len(self))[index]
            elif not isinstance(index, torch.Tensor):
                index = as_long_tensor(index, name="index")
        if index.dtype is not torch.long or (index.numel() and index.device.type == "cpu"):
            # a mask of slots (as TorchRL's get takes one), negative slots (from the last
            # written one), ints of another dtype; a float tensor is refused naming index
            index = written_slots(index, self._rows_written() * layout.row_numel,
                                  layout.rows * layout.row_numel)
        return self._format.from_td(layout.gather(index))

    def get_trusted(self, index: torch.Tensor) -> Any:
        """:meth:`get` of slots a sampler drew from this storage's written slots, without
        checking them again (a buffer calls it for samplers that declare
        :attr:`~tdreplay.core.Sampler.draws_written_slots`); anything else than an int64
        tensor of slots takes :meth:`get`.

        Examples
        --------
        >>> s = LazyTensorStorage(10)
        >>> s.set(slice(0, 4), torch.arange(4) * 10)
        >>> s.get_trusted(torch.tensor([3, 0])).tolist()
        [30, 0]
        """
        layout = self._current_layout()
        if layout is None or type(index) is not torch.Tensor or index.dtype is not torch.long:
            return self.get(index)
        return self._format.from_td(layout.gather(index))

    def __getitem__(self, index: Any) -> Any:
        layout = self._current_layout()
        if layout is None:
            raise RuntimeError("cannot read from a storage that was never written.")
        _check_index_dtype(index)
        kind = self._format.kind
        if (kind == KIND_TENSOR or kind == KIND_PYTREE) and is_key_index(index):
            # (its entries are named by the storage: '_tensor', or pytree leaves '0', '1', ...)
            raise KeyError(f"storage[{index!r}]: this storage holds {kind} data, not "
                           "TensorDicts: it has no entry to select by key.")
        try:
            read = layout.read_index(self._rows_written(), index)
        except IndexError:
            if self.ndim > 1:  # (the dim out of range named in the storage's layout)
                self._check_index_range(index, f"storage[{format_index(index)}]")
            raise
        return self._format.from_td(read)

    def __len__(self) -> int:
        layout = self._current_layout()
        return 0 if layout is None else self._rows_written() * layout.row_numel

    def flatten(self) -> Storage:
        """This storage with its ``ndim`` leading dimensions flattened into one (TorchRL's
        ``storage.flatten()``).

        ``ndim == 1``: the storage itself. Else a :class:`TensorStorage` of ``ndim=1`` over the
        written rows (all rows once the storage is full), flattened: its ``max_size`` is the
        number of written slots, all written. As TorchRL's, it is a view: its tensors share
        the storage's memory (a write into one shows in the other), except non-tensor
        entries, which it holds copies of. A storage that was never written raises
        ``RuntimeError``.

        Examples
        --------
        >>> from tensordict import TensorDict
        >>> s = LazyTensorStorage(12, ndim=2)
        >>> s.set(slice(0, 2), TensorDict({"obs": torch.arange(8.).reshape(2, 4)}, [2, 4]))
        >>> flat = s.flatten()
        >>> type(flat).__name__, flat.ndim, flat.max_size, len(flat)
        ('TensorStorage', 1, 8, 8)
        >>> flat.get(torch.tensor([5]))["obs"].tolist()
        [5.0]
        >>> flat[5] = TensorDict({"obs": torch.tensor(50.)}, [])  # the same memory
        >>> s[1]["obs"].tolist()
        [4.0, 50.0, 6.0, 7.0]
        """
        if self.ndim == 1:
            return self
        layout = self._current_layout()
        if layout is None:
            raise RuntimeError("Cannot flatten a non-initialized storage (nothing was written "
                               "to it yet).")
        rows = self._rows_written()
        if rows == 0:
            raise RuntimeError("Cannot flatten a storage without written rows (it was emptied): "
                               "a TensorStorage holds at least one slot.")
        flat = layout.read_index(rows, slice(None)).flatten(0, self.ndim - 1)
        return TensorStorage(self._format.from_td(flat), device=layout.device)

    # ---- in-place edits --------------------------------------------------------------------------
    def _edit_guard(self) -> EditGuard:
        """What an in-place edit of the written rows runs in (see
        :mod:`~tdreplay.storages._entry_edits`): nothing here; a storage shared by processes
        takes its lock and records the rows first."""
        return NO_GUARD

    def set_key(self, key: Any, value: Any, index: Any = None) -> None:
        layout = self._current_layout()
        if layout is None:
            raise RuntimeError("the storage is empty: nothing to set.")
        with self._edit_guard() as guard:
            rows = self._rows_written()
            edit = layout.entry_edit(key, value, rows, index)  # (checked)
            guard.record(layout.td, edit.keys, index, rows)
            edit.write()

    def update_(self, data: Any, clone: bool = False, keys_to_update: Any = None) -> None:
        check_flag(clone, "clone")
        layout = self._current_layout()
        if layout is None:
            raise RuntimeError("the storage is empty: nothing to update.")
        with self._edit_guard() as guard:
            n = self._rows_written()
            rows = layout.td[:n]
            data = TensorDict(data, batch_size=rows.batch_size) if isinstance(data, dict) \
                else data
            updates = checked_updates(layout, rows, data, keys_to_update)
            objects = layout.object_updates(data, n, keys_to_update)  # (checked before writes)
            guard.record(layout.td, list(updates), None, n)
            for key, value in updates.items():
                rows.get(key).copy_(value.clone() if clone else value)
            if objects is not None:
                objects()

    # ---- lifecycle -------------------------------------------------------------------------------
    def empty(self) -> None:
        self._set_rows_written(0)
        self.last_written_row = None

    def state_dict(self) -> dict[str, Any]:
        rows = clone_exact(self.written_rows()) if self.initialized else None  # (-0.0 kept)
        return {"initialized": rows is not None, "len_rows": self._rows_written(), "storage": rows,
                "kind": self._format.kind, "max_size": self.max_size, **self._format.meta(),
                **self._classes_meta()}

    def check_state_dict(self, state_dict: dict[str, Any]) -> None:
        check_tensor_state(self, state_dict)  # another max_size, too many rows, another layout

    def saved_rows(self, state_dict: dict[str, Any]) -> int:
        return int(state_dict["len_rows"]) if state_dict["initialized"] else 0

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        meta = check_tensor_state(self, state_dict)  # before anything changes
        if meta is None:
            self._set_rows_written(0)
        else:
            self.install(meta, state_dict["storage"])

    def __repr__(self) -> str:
        shape = self.shape
        return (f"{type(self).__name__}(max_size={self.max_size}, ndim={self.ndim}, "
                f"shape={None if shape is None else tuple(shape)}, len={len(self)}, "
                f"device={self._device})")


class LazyTensorStorage(TensorStorage):
    """A :class:`TensorStorage` whose tensors are allocated from the first write.

    Parameters
    ----------
    max_size : int
        Capacity in slots.
    device : str or torch.device
        Where the data lives (``"cpu"`` by default; ``"cuda"`` keeps the whole buffer on GPU).
    ndim : int
        Leading dimensions counted in the capacity (see :class:`TensorStorage`).
    compilable : bool
        As TorchRL: ``True`` keeps the count of written rows in a 0-dim tensor
        (:meth:`written_slots_tensor`) and writes batches at tensor rows without reading them
        back as ints, so that a ``torch.compile``'d ``extend`` + ``sample`` stops recompiling
        once warmed up. Same data and ``state_dict`` either way.
    consolidated : bool
        As TorchRL: ``True`` consolidates the storage's TensorDict when the first write lays it
        out (tensordict's ``consolidate()``): every entry then lives in one buffer, which
        pickles as one block and moves between devices in one copy. Writes, reads,
        ``state_dict`` and checkpoints are the same either way. Only TensorDict and
        tensorclass data can be consolidated: a first write of other data (a tensor, a pytree)
        raises ``ValueError`` and leaves the storage unwritten. An entry added later (data
        with a new key) is allocated beside the buffer. With ``shared_init=True`` it has no
        effect (as TorchRL): the shared storage keeps one memory-mapped file per entry.
        Defaults to ``False``.
    shared_init : bool
        ``True``: shared between processes, laid out by whichever writes first; builds a
        :class:`~tdreplay.storages.shared_tensor_storage.SharedLazyTensorStorage`.
    cleanup_memmap : bool
        With ``shared_init=True``: whether the temporary directory of the storage's
        memory-mapped files is removed when the storage is dropped (garbage-collected, or the
        process exits) in the process that created it. ``False`` keeps the files (at
        ``storage.scratch_dir``). TorchRL documents that ``True`` removes them after the first
        write and moves the storage to RAM, which would stop the processes sharing its rows;
        its storage keeps them in either case. No effect without ``shared_init``. Defaults to
        ``True``.

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> s = LazyTensorStorage(100, ndim=2)
    >>> s.set(slice(0, 2), TensorDict({"obs": torch.zeros(2, 10, 3)}, [2, 10]))
    >>> s.shape, len(s)
    (torch.Size([10, 10]), 20)
    >>> s = LazyTensorStorage(10, consolidated=True)
    >>> s.set(slice(0, 2), TensorDict({"a": torch.ones(2), "b": torch.zeros(2, 3)}, [2]))
    >>> s.get(torch.tensor([1]))["a"].tolist()
    [1.0]
    >>> rows = s.written_rows()
    >>> rows["a"].untyped_storage().data_ptr() == rows["b"].untyped_storage().data_ptr()
    True
    """

    #: the class ``LazyTensorStorage(shared_init=True)`` builds (set by ``shared_tensor_storage``)
    shared_init_class: type[LazyTensorStorage] | None = None
    shared_init = False  #: whether the storage is shared between processes from its first write

    def __new__(cls, *args: Any, shared_init: bool = False, **kwargs: Any) -> LazyTensorStorage:
        shared_init = check_flag(shared_init, "shared_init")
        if shared_init and cls is LazyTensorStorage and cls.shared_init_class is not None:
            cls = cls.shared_init_class
        return super().__new__(cls)

    def __init__(
        self,
        max_size: int,
        *,
        device: str | torch.device = "cpu",
        ndim: int = 1,
        checkpointer: StorageCheckpointerBase | None = None,
        compilable: bool = False,
        consolidated: bool = False,
        shared_init: bool = False,
        cleanup_memmap: bool = True,
    ) -> None:
        if check_flag(shared_init, "shared_init"):
            raise ValueError("shared_init=True is for LazyTensorStorage itself (import "
                             "tdreplay.storages.shared_tensor_storage).")
        consolidated = check_flag(consolidated, "consolidated")
        cleanup_memmap = check_flag(cleanup_memmap, "cleanup_memmap")
        super().__init__(None, max_size, device=device, ndim=ndim, checkpointer=checkpointer,
                         compilable=compilable)
        self.consolidated = consolidated
        #: TorchRL's ``cleanup_memmap`` (see the class docstring; used with ``shared_init``)
        self.cleanup_memmap = cleanup_memmap
