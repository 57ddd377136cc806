"""Reads and writes of a ``LazyMemmapStorage``'s rows, under its process lock.

A ``set`` that overwrites counted rows records them first (whoever takes the lock after a
writer that died drops them: ``_torn_writes``), and so does a first write past the count until
the hold ends; ``storage[i] = x`` of counted rows and ``empty`` are journaled instead, so a
process that dies in the middle leaves the rows as they were (``_shared_edits``). Reads run
under the lock and return on the storage's output device.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from tdreplay.core.utils import as_long_tensor, check_flag, range_tensor

from ._formats import DataFormat
from ._layout import TensorLayout
from ._memmap_shared import _STATE_LEN, _STATE_TORN, SharedStateMixin
from ._torn_writes import PACKED_ROWS


class MemmapRowsMixin(SharedStateMixin):
    """The row reads and writes of a memory-mapped storage, under its process lock (mixed into
    :class:`~tdreplay.storages.LazyMemmapStorage`, before the ``LazyTensorStorage`` whose
    reads and writes it wraps; a ``RevisionTracking``, so its ``set`` and ``empty`` advance the
    revision)."""

    # the storage's attributes read here (annotations only: a class default would slow down
    # every attribute read of the storage, see tdreplay.core.buffer_parts)
    _layout: TensorLayout | None
    _format: DataFormat
    _out_device: torch.device

    if TYPE_CHECKING:  # what the storage this is mixed into provides
        def _current_layout(self) -> TensorLayout | None: ...

    def _recover_torn_rows(self) -> int:
        """Drop the rows a writer that died was overwriting (under the lock); how many."""
        torn = self._torn
        return torn.recover(self._current_layout()) if torn.pending else 0

    def set(self, cursor: int | slice | torch.Tensor | Sequence[int], data: Any, *,
            set_cursor: bool = True) -> None:
        if set_cursor is not True and set_cursor is not False:  # (one check when a bool)
            check_flag(set_cursor, "set_cursor")
        # (taking the lock dropped any torn rows: _ProcessLock.watch)
        with self._lock_obj:
            state = self._state.view
            if state[_STATE_TORN]:  # the hold's last write or edits: complete, counters moved
                self._torn.settle_hold()
            if not set_cursor and self._set_in_place(cursor, data):
                return
            if type(cursor) is slice and cursor.step is None:  # what round-robin writers pass
                start, stop, layout = cursor.start, cursor.stop, self._layout
                if start is not None and stop is not None and 0 <= start < stop and (
                        start >= state[_STATE_LEN]
                        or (layout is not None and stop <= layout.rows < PACKED_ROWS)):
                    # a first write past the count (counted once copied) or an overwrite of
                    # counted rows: recorded until the hold ends (the writer's counters move
                    # after this returns: see _torn_writes)
                    self._torn.record_rows(start, stop)
                    self._write_recorded(cursor, data, set_cursor)
                    return
            self._set_over_counted(cursor, data, set_cursor)

    def _write_recorded(self, rows: Any, data: Any, set_cursor: bool) -> None:
        """Write rows recorded as under way; their record is cleared as the hold ends. An
        interrupt (``KeyboardInterrupt``, or what a signal handler raises: not an
        ``Exception``) leaves the record: the writer writes the rows again whole before it
        propagates (see ``RoundRobinWriter``), which settles it, and a write no one completes
        is recovered as a dead process's is, by the next holder of the lock."""
        try:
            super().set(rows, data, set_cursor=set_cursor)  # type: ignore[misc]
        except Exception as err:
            self._torn.failed(err, self._layout)
            raise
        self._lock_obj.before_unlock = self._torn.settle_hold

    def _set_in_place(self, rows: Any, data: Any) -> bool:
        """``storage[i] = x`` / ``rb[i] = x`` (``set`` with ``set_cursor=False``) of rows that
        are all counted: journaled as an edit of every entry of those rows, so a process that
        dies in the middle leaves them as before (none dropped: they were committed). ``False``
        (nothing done) for rows not all counted, left to the write paths."""
        layout, written = self._layout, self._rows_written()
        if layout is None or not written:
            return False
        flat = as_long_tensor(rows, name="index").reshape(-1) if not isinstance(rows, slice) \
            else range_tensor(range(*rows.indices(layout.rows)))
        if not flat.numel() or int(flat.min()) < 0 or int(flat.max()) >= written:
            return False
        with self._edit_guard() as guard:
            guard.record(layout.td, layout.keys, rows, written)
            super().set(rows, data, set_cursor=False)  # type: ignore[misc]
        return True

    def _set_over_counted(self, rows: int | slice | torch.Tensor | Sequence[int],
                          data: Any, set_cursor: bool) -> None:
        """``set`` of rows that may be counted already: recorded while they are overwritten
        (until the hold ends)."""
        torn = self._torn
        written = self._rows_written()
        layout = self._current_layout() if written else None
        if layout is None or not torn.begin(rows, written, layout.rows):
            super().set(rows, data, set_cursor=set_cursor)  # type: ignore[misc]
            return
        self._write_recorded(rows, data, set_cursor)

    def empty(self) -> None:
        """Forget the written rows (the count to 0): journaled as a load of no rows (the old
        count, cursor and write count; see ``_shared_edits``), so that a buffer's ``loads`` of
        an empty checkpoint whose process dies leaves the storage as it was."""
        with self._edit_guard() as guard:
            guard.overwrite(self._current_layout(), 0, self._rows_written())
            super().empty()

    def get(self, index: int | torch.Tensor) -> Any:
        with self._lock_obj:
            out = super().get(index)  # type: ignore[misc]
        if self._out_device.type != "cpu":
            out = out.to(self._out_device)
        return out

    def get_trusted(self, index: torch.Tensor) -> Any:
        """:meth:`TensorStorage.get_trusted`; while counted rows are being overwritten by
        another process, or were left torn by one that died (the slots may have been drawn
        before), :meth:`get`: under the lock, after them, with the slots checked.

        Examples
        --------
        >>> from tdreplay.storages import LazyMemmapStorage
        >>> s = LazyMemmapStorage(10)
        >>> s.set(slice(0, 4), torch.arange(4) * 10)
        >>> s.get_trusted(torch.tensor([3, 0])).tolist()
        [30, 0]
        """
        layout = self._current_layout()
        if (self._state.view[_STATE_TORN] and not self._lock_obj.held) or layout is None \
                or type(index) is not torch.Tensor or index.dtype is not torch.long:
            return self.get(index)
        return self._format.from_td(layout.gather(index))  # (TensorStorage's, inlined)

    def __getitem__(self, index: Any) -> Any:
        with self._lock_obj:
            out = super().__getitem__(index)  # type: ignore[misc]
        return out if self._out_device.type == "cpu" else out.to(self._out_device)

    def rows_capacity_for(self, data: Any, batched: bool) -> int:
        with self._lock_obj:
            return super().rows_capacity_for(data, batched)  # type: ignore[misc]
