"""Where a tensor storage keeps its count of written rows, and the writes of a storage built
with ``compilable=True`` (no storage imports).

``torch.compile`` guards on the int attributes a traced function reads, so a compiled
``extend`` + ``sample`` would recompile at each new count. With ``compilable=True`` the count
lives in a 0-dim int64 tensor and batches are written at tensor rows without reading them back
as ints; everything else (``len``, ``state_dict``) still sees an int.
"""

from __future__ import annotations

from typing import Any

import torch

from ._formats import KIND_TC, DataFormat, to_tensordict
from ._layout import TensorLayout
from ._row_gaps import check_no_gap
from ._tensorclasses import classes_of


class CompilableRows:
    """Base of :class:`~tdreplay.storages.TensorStorage`: the written-row count (an int, or a
    0-dim tensor when ``compilable=True``) and the tensor-row writes of the compilable path."""

    _len_rows: int = 0  #: written rows (the base keeps the count here; see _rows_written)
    #: compilable=True (and the count kept by this class): written rows in a 0-dim int64 tensor
    _len_tensor: torch.Tensor | None = None
    #: whether compilable=True keeps the count in ``_len_tensor`` (False for a subclass that
    #: keeps its count elsewhere, overriding _rows_written / _set_rows_written)
    _counts_in_tensor_when_compilable: bool = True
    last_written_row: int | None
    ndim: int
    _format: DataFormat
    _device: torch.device

    def _current_layout(self) -> TensorLayout | None:
        raise NotImplementedError

    def _count_in_tensor(self, compilable: bool) -> None:
        """Keep the count in a tensor from now on when ``compilable`` (and this class keeps it)."""
        if compilable and self._counts_in_tensor_when_compilable:
            self._len_tensor = torch.zeros((), dtype=torch.long)

    def _rows_written(self) -> int:
        """Number of written rows (a subclass may keep it in shared memory)."""
        tensor = self._len_tensor
        return self._len_rows if tensor is None else int(tensor)

    def _set_rows_written(self, rows: int) -> None:
        """Record ``rows`` written rows (what :meth:`_rows_written` then returns)."""
        tensor = self._len_tensor
        if tensor is None:
            self._len_rows = rows
        else:
            tensor.fill_(rows)

    def written_slots_tensor(self) -> torch.Tensor | None:
        """The written slots as a 0-dim int64 CPU tensor when built with ``compilable=True``
        (``None`` otherwise, and before a lazy storage's first write).

        Examples
        --------
        >>> from tdreplay.storages import LazyTensorStorage
        >>> s = LazyTensorStorage(10, compilable=True)
        >>> s.set(torch.tensor([0, 1, 2]), torch.arange(3))
        >>> s.written_slots_tensor(), LazyTensorStorage(10).written_slots_tensor()
        (tensor(3), None)
        """
        tensor = self._len_tensor
        layout = self._current_layout()
        if tensor is None or layout is None:
            return None
        return tensor if layout.row_numel == 1 else tensor * layout.row_numel

    def _set_compiled(self, rows: Any, data: Any, set_cursor: bool = True) -> bool:
        """``set`` of a batch at a 1-D tensor of rows for a ``compilable=True`` storage:
        tensor ops only (no int of the rows), the count kept in its tensor. Returns False,
        writing nothing, for what the generic path handles (other rows than a 1-D int
        tensor, a first write, a new entry, another kind of data, a TensorDict holding
        tensorclasses); the tensorclasses nested in a tensorclass are checked here as the
        generic path checks them."""
        layout = self._current_layout()
        len_tensor = self._len_tensor
        if layout is None or len_tensor is None or type(rows) is not torch.Tensor \
                or rows.ndim != 1 or rows.is_floating_point():
            return False
        td, kind, extra = to_tensordict(data, batched=True, ndim=self.ndim)
        fmt = self._format
        if kind != fmt.kind or (extra is not None and extra != fmt.extra):
            return False
        leaves = layout.matching_leaves(td)
        if leaves is None:
            return False
        if kind == KIND_TC and layout.has_levels:
            layout.check_classes(classes_of(data, td, kind))
        src = layout.source_leaves(td, (rows.numel(), *layout.inner), leaves)
        if not rows.numel():
            return True
        cap = layout.rows
        # negative rows count from the rows written (from the end once full), as get(-1)
        written = len_tensor.to(rows.device)
        rows = torch.where(rows < 0, rows + written, rows)
        out = ((rows < 0) | (rows >= cap)).any()
        # a gap past the written rows (check_no_gap), in tensor ops: the rows sorted, those
        # below the written ones raised to the last written one, step by at most 1 from it
        steps = torch.cat([(written - 1).reshape(1),
                           torch.maximum(rows.sort().values, written - 1)]).diff()
        if bool(out | (steps > 1).any()):  # a tensor test: no guard on the rows
            if bool(out):
                raise IndexError(f"rows out of range for a storage of {cap} rows.")
            check_no_gap(rows, False, int(len_tensor), cap, type(self).__name__)
        layout.index_copy_rows(rows.to(self._device), src)
        rows = rows.to(len_tensor.device)
        len_tensor.copy_(torch.maximum(len_tensor, rows.max() + 1))
        if set_cursor:
            self.last_written_row = int(rows[-1])
        return True
