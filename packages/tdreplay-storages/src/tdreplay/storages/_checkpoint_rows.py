"""What checkpointers use of a tensor storage (:class:`CheckpointRowsMixin`, mixed into
:class:`~tdreplay.storages.TensorStorage`): its written rows, their layout as JSON-ready
metadata, the check that saved rows fit it, and their installation."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tensordict import TensorDictBase

from ._entry_edits import EditGuard
from ._formats import KIND_TD, DataFormat
from ._layout import TensorLayout
from ._state_checks import check_rows_fit
from ._tensorclasses import classes_from_record, classes_record

__all__ = ["CheckpointRowsMixin"]


class CheckpointRowsMixin:
    """The rows of a tensor storage as checkpointers save and restore them."""

    max_size: int
    ndim: int
    non_tensor_refusal: str | None
    _format: DataFormat
    # the storage's (tensor_storage.py): its layout, its count of written rows, how it lays
    # itself out for data, what guards an overwrite of counted rows, and its capacity rule
    _current_layout: Callable[[], TensorLayout | None]
    _rows_written: Callable[[], int]
    _set_rows_written: Callable[[int], None]
    _create: Callable[..., None]
    _check_consolidable: Callable[[str], None]
    _edit_guard: Callable[[], EditGuard]
    rows_capacity_for: Callable[[Any, bool], int]

    def written_rows(self) -> TensorDictBase:
        """The written rows as a TensorDict of batch shape ``[rows written, *inner]``.

        A view: writing into its tensors writes into the storage. Non-tensor entries (strings
        and other JSON values) are ``NonTensorStack`` copies of the storage's values: write
        them with :meth:`set` or :meth:`set_key`. Whatever kind of data the storage holds
        (tensor, tensorclass, pytree), this is its TensorDict form (what checkpointers save).
        ``RuntimeError`` before a lazy storage's first write.

        Examples
        --------
        >>> import torch
        >>> from tdreplay.storages import LazyTensorStorage
        >>> s = LazyTensorStorage(10)
        >>> s.set(slice(0, 3), torch.arange(3))
        >>> rows = s.written_rows()
        >>> rows.batch_size, rows["_tensor"].tolist()
        (torch.Size([3]), [0, 1, 2])
        """
        layout = self._current_layout()
        if layout is None:
            raise RuntimeError("the storage was never written: it has no rows.")
        return layout.rows_view(self._rows_written())

    def layout_meta(self) -> dict[str, Any]:
        """The storage's layout as JSON-ready values (what a checkpoint's ``storage.json`` holds).

        Keys: ``class``, ``max_size``, ``ndim``, ``initialized``, ``len_rows`` (written rows),
        ``rows`` (row capacity, ``None`` before the first write), ``kind`` (``"tensordict"``,
        ``"tensor"``, ``"tensorclass"`` or ``"pytree"``), ``treespec`` and ``tensorclass``
        (strings naming the pytree structure / tensorclass, else ``None``), and for data
        with tensorclasses nested in it (``td["obs"]`` an ``Obs``), ``nested_tensorclasses``:
        ``[[key path, "module:qualname"], ...]``, which a storage loading the checkpoint
        imports to read those levels back as their classes.

        Examples
        --------
        >>> import torch
        >>> from tdreplay.storages import LazyTensorStorage
        >>> s = LazyTensorStorage(10, ndim=2)
        >>> s.set(slice(0, 1), torch.zeros(1, 5))
        >>> meta = s.layout_meta()
        >>> meta["rows"], meta["len_rows"], meta["kind"]
        (2, 1, 'tensor')
        >>> from tensordict import TensorDict, tensorclass
        >>> @tensorclass
        ... class Obs:
        ...     pos: torch.Tensor
        >>> s = LazyTensorStorage(10)
        >>> s.set(slice(0, 2), TensorDict(obs=Obs(pos=torch.zeros(2, 3), batch_size=[2]),
        ...                               batch_size=[2]))
        >>> s.layout_meta()["nested_tensorclasses"]  # doctest: +ELLIPSIS
        [[['obs'], '...:Obs']]
        """
        layout = self._current_layout()
        return {
            "class": type(self).__name__,
            "max_size": self.max_size,
            "ndim": self.ndim,
            "initialized": layout is not None,
            "len_rows": self._rows_written(),
            "rows": None if layout is None else layout.rows,
            "kind": self._format.kind,
            **self._format.meta(),
            **self._classes_meta(),
        }

    def check_layout_compatible(self, meta: dict[str, Any], data: TensorDictBase) -> None:
        """Raise :class:`~tdreplay.core.CheckpointError` unless :meth:`install` can put ``data``
        (rows described by ``meta``, a :meth:`layout_meta` of the saved storage) here.

        Checks the row count against ``meta``, and against this storage's layout (once it has
        one; else the one it would lay out) the kind of data, row capacity, keys, row shapes
        and dtypes. Changes nothing: a lazy storage stays unlaid.

        Examples
        --------
        >>> import torch
        >>> from tdreplay.storages import LazyTensorStorage
        >>> s = LazyTensorStorage(10)
        >>> s.set(slice(0, 2), torch.zeros(2, 3))
        >>> t = LazyTensorStorage(10)
        >>> t.set(slice(0, 2), torch.zeros(2, 4))
        >>> t.check_layout_compatible(s.layout_meta(), s.written_rows())  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        tdreplay.core.checkpoint.CheckpointError: checkpoint entry '_tensor' has row shape (3,), ...
        """
        layout = self._current_layout()
        if layout is None:  # (laid out by the load: a consolidated one holds tensor collections)
            self._check_consolidable(meta.get("kind", KIND_TD))
        check_rows_fit(layout, self._format, meta, data, self.rows_capacity_for,
                       self.non_tensor_refusal)

    def install(self, meta: dict[str, Any], data: TensorDictBase) -> None:
        """Make ``data`` the written rows (``meta["len_rows"]`` of them), laying out a lazy
        storage first; call :meth:`check_layout_compatible` before.

        Examples
        --------
        >>> import torch
        >>> from tdreplay.storages import LazyTensorStorage
        >>> s = LazyTensorStorage(10)
        >>> s.set(slice(0, 2), torch.tensor([[1, 2], [3, 4]]))
        >>> t = LazyTensorStorage(10)
        >>> t.check_layout_compatible(s.layout_meta(), s.written_rows())
        >>> t.install(s.layout_meta(), s.written_rows())
        >>> len(t), t[1].tolist()
        (2, [3, 4])
        """
        layout = self._current_layout()
        if layout is None:
            kind = meta.get("kind", KIND_TD)
            self._format = DataFormat(kind, DataFormat.resolve_extra(meta))
            # (a checkpoint without a record of nested tensorclasses: plain TensorDicts)
            self._create(data, batched=True,
                         classes=classes_from_record(meta.get("nested_tensorclasses")))
            layout = self._current_layout()
            assert layout is not None
        n = int(meta["len_rows"])
        # (a shared storage journals the old count, cursor and replaced rows first: a loader
        # that dies leaves the storage as it was, see _shared_edits)
        with self._edit_guard() as guard:
            guard.overwrite(layout, n, self._rows_written())
            layout.install_rows(n, data)
            self._set_rows_written(n)

    def _classes_meta(self) -> dict[str, Any]:
        """``{"nested_tensorclasses": record}`` of the tensorclasses nested in the data (see
        :meth:`layout_meta`); ``{}`` when there are none (the metadata of other data is as it
        was before they were recorded)."""
        layout = self._current_layout()
        if layout is None or not layout.nested_classes:
            return {}
        return {"nested_tensorclasses": classes_record(layout.nested_classes)}
