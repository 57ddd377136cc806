"""The guard of the in-place edits of a storage shared by processes (``LazyMemmapStorage``):
:class:`SharedEdit`, what its ``_edit_guard()`` returns (see :mod:`~._entry_edits`).

It holds the storage's process lock for the whole edit (the rows counted, the checks, the
writes). An edit of entries journals the old values of the rows it touches
(:meth:`~._torn_writes.TornWrites.record_edit`) and leaves their record for the lock to clear
as it is released (so the edits of one lock hold are undone together if the process dies);
an edit that raises once recorded writes its old values back. A load is journaled as one such
edit (:meth:`~._torn_writes.TornWrites.record_load`): the old row count, cursor and write count,
and the old values of the counted rows it replaces, so that a loader that dies leaves the
storage as it was before the load (rows, count and cursor) until the lock is released, and a
load that raises writes them back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ._edit_journal import count_rows, touched_rows
from ._entry_edits import EditGuard
from ._keys import NestedKey

if TYPE_CHECKING:
    from types import TracebackType

    from tensordict import TensorDictBase

    from ._layout import TensorLayout
    from ._memmap_shared import _ProcessLock
    from ._torn_writes import TornWrites

__all__ = ["SharedEdit"]


class SharedEdit(EditGuard):
    """One in-place edit of a shared storage whose lock is ``lock`` and whose torn-write
    record is ``torn``."""

    __slots__ = ("_lock", "_recorded", "_td", "_torn")

    def __init__(self, lock: _ProcessLock, torn: TornWrites) -> None:
        self._lock = lock
        self._torn = torn
        self._td: TensorDictBase | None = None  # the rows of the edit (or load) recorded
        self._recorded = False

    def __enter__(self) -> SharedEdit:
        self._lock.acquire()  # (drops or restores what a process that died left)
        return self

    def record(self, td: TensorDictBase, keys: Sequence[NestedKey], index: Any,
               rows: int) -> None:
        touched = touched_rows(index, rows)
        if not keys or not count_rows(touched):
            return
        torn = self._torn
        torn.record_edit(td, keys, touched)
        self._td, self._recorded = td, True
        self._lock.before_unlock = torn.settle_hold  # (the hold's edits complete then)

    def overwrite(self, layout: TensorLayout | None, rows: int, written: int) -> None:
        # the old counters and the counted rows replaced ([0, min(rows, written))), journaled
        # as one edit: undone together if this process dies before the lock is released
        # (``layout`` None: a storage not laid out, emptied: the counters only)
        torn = self._torn
        td = None if layout is None else layout.td
        torn.record_load(td, [] if layout is None else layout.keys,
                         min(rows, written) if layout is not None else 0)
        self._td, self._recorded = td, True
        self._lock.before_unlock = torn.settle_hold  # (the load is complete then)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            if exc is not None and self._recorded:
                self._take_back(self._td)
        finally:
            self._lock.release()

    def _take_back(self, td: TensorDictBase | None) -> None:
        """The edit raised once recorded: its old values back before the error goes on."""
        try:
            self._torn.take_back_edit(td)
        except BaseException:
            # not all back: the record stays, and whoever takes the lock next (this process
            # too) writes back the old values of every edit of this hold
            self._lock.before_unlock = None
            self._torn.edits.forget()
            raise
