"""In-place writes at an index of a tensor storage (:class:`IndexWritesMixin`, mixed into
:class:`~.tensor_storage.TensorStorage`): a number written as data of the storage's dtype,
the range of an index of a multi-dim storage checked dim by dim, and the entry a TensorDict
written at an index adds."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDictBase

from tdreplay.core.utils import is_int

from ._formats import KIND_TC, KIND_TD, DataFormat
from ._index_values import check_index_range, format_index, index_batch_dims, number_value
from ._layout import TensorLayout
from ._object_layout import grown_layout
from ._row_writes import cursor_rows
from ._tensorclasses import NestedClasses

__all__ = ["IndexWritesMixin"]


class IndexWritesMixin:
    """Numbers, index ranges and new entries of the writes at an index of a tensor storage."""

    if TYPE_CHECKING:  # what the storage this is mixed into provides
        _format: DataFormat
        _device: torch.device
        ndim: int
        adds_entries: bool
        non_tensor_refusal: str | None

        def _current_layout(self) -> TensorLayout | None: ...
        def _rows_written(self) -> int: ...
        def _allocate(self, shape: torch.Size, dtype: torch.dtype,
                      key: Any = None) -> torch.Tensor: ...

    def _number_rows(self, cursor: Any, value: Any, name: str) -> torch.Tensor:
        """``value`` (a number, argument ``name``) as the data :meth:`set` writes at ``cursor``
        (rows resolved): a tensor of the storage's dtype expanded over the rows and an
        item's shape; ``TypeError`` / ``ValueError`` naming ``name`` (see
        :func:`~._index_values.number_value`)."""
        layout = self._current_layout()
        if layout is None:
            return number_value(layout, self._format.kind, value, name)  # (refused)
        if type(cursor) is int or (type(cursor) is not slice and is_int(cursor)):
            return number_value(layout, self._format.kind, value, name, layout.inner)
        count = cursor_rows(cursor, layout.rows, self._rows_written())
        return number_value(layout, self._format.kind, value, name, (count, *layout.inner))

    def index_to_rows(self, index: Any, value: Any = None) -> torch.Tensor:
        """Rows of ``index`` (see :meth:`~tdreplay.core.Storage.index_to_rows`). A tuple
        index of a multi-dim storage is checked at every dim first: an ``IndexError`` names
        the dim out of range and the valid indices there, in the storage's layout
        ``[rows, *inner]``.

        Examples
        --------
        >>> from tdreplay.storages import LazyTensorStorage
        >>> s = LazyTensorStorage(12, ndim=2)
        >>> s.set(slice(0, 6), torch.zeros(6, 2))
        >>> s.index_to_rows((1, 0)).tolist()
        [1]
        >>> s.index_to_rows((0, 7))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        tdreplay...IndexOutOfRangeError: storage[0, 7]: index 7 is out of range for dim 1 ...
        """
        if type(index) is tuple and self.ndim > 1:
            self._check_index_range(index, f"storage[{format_index(index)}]")
        return super().index_to_rows(index, value)  # type: ignore[misc]  # (Storage's)

    def _check_index_range(self, index: Any, what: str) -> None:
        """``IndexError`` naming ``what`` for a part of ``index`` out of range of the
        storage's dims (see :func:`~._index_values.check_index_range`)."""
        layout = self._current_layout()
        if layout is not None:
            check_index_range((self._rows_written(), *layout.inner), index, what)

    def _grown_for_index(self, layout: TensorLayout, td: TensorDictBase, kind: str,
                         classes: NestedClasses) -> TensorLayout:
        """``layout`` with the entries that ``td`` (a TensorDict or tensorclass of this
        storage's kind, written at an index of its dims: ``storage[i, j] = td``) adds, each
        zero-filled in every row, as :meth:`set` adds them (:attr:`adds_entries`); ``layout``
        itself when ``td`` adds none, lacks one of the storage's entries, or is of another kind
        or of a batch shape whose dims for the storage's are not known (the write then refuses
        its new keys, naming them). The storage keeps ``layout`` until the edit is checked.

        Examples
        --------
        >>> from tensordict import TensorDict
        >>> from tdreplay.storages import LazyTensorStorage
        >>> s = LazyTensorStorage(6, ndim=2)
        >>> s.set(slice(0, 2), TensorDict({"obs": torch.ones(2, 3)}, [2, 3]))
        >>> s[1, 0] = TensorDict({"obs": torch.tensor(5.0), "v": torch.tensor([1, 2])}, [])
        >>> s[:]["v"].tolist()
        [[[0, 0], [0, 0], [0, 0]], [[1, 2], [0, 0], [0, 0]]]
        """
        if not self.adds_entries or kind != self._format.kind or kind not in (KIND_TD, KIND_TC):
            return layout
        skip = index_batch_dims(layout, td)
        if skip is None:
            return layout
        return grown_layout(layout, td, self._allocate, skip, self._device,
                            self.non_tensor_refusal, classes)
