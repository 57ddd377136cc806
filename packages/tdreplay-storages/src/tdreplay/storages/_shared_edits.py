"""The guard of the in-place edits of a storage shared by processes (``LazyMemmapStorage``):
:class:`SharedEdit`, what its ``_edit_guard()`` returns (see :mod:`~._entry_edits`).

It holds the storage's process lock for the whole edit (the rows counted, the checks, the
writes). An edit of entries journals the old values of the rows it touches
(:meth:`~._torn_writes.TornWrites.record_edit`) and leaves their record for the lock to clear
as it is released (so the edits of one lock hold are undone together if the process dies);
an edit that raises once recorded writes its old values back. A load that replaces counted
rows records them as an overwrite (:meth:`~._torn_writes.TornWrites.begin`).
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

    __slots__ = ("_layout", "_lock", "_overwriting", "_td", "_torn")

    def __init__(self, lock: _ProcessLock, torn: TornWrites) -> None:
        self._lock = lock
        self._torn = torn
        self._td: TensorDictBase | None = None  # set once an edit of entries is recorded
        self._layout: TensorLayout | None = None
        self._overwriting = False  # a load's rows recorded

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
        self._td = td
        self._lock.before_unlock = torn.settle_edits  # (the hold's edits complete then)

    def overwrite(self, layout: TensorLayout, rows: int, written: int) -> None:
        self._layout = layout
        self._overwriting = bool(written) and self._torn.begin(slice(0, rows), written,
                                                               layout.rows)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            if self._overwriting:
                if exc is None:
                    self._torn.end()
                else:
                    self._torn.failed(exc, self._layout)
            elif exc is not None and self._td is not None:
                self._take_back(self._td)
        finally:
            self._lock.release()

    def _take_back(self, td: TensorDictBase) -> None:
        """The edit raised once recorded: its old values back before the error goes on."""
        try:
            self._torn.take_back_edit(td)
        except BaseException:
            # not all back: the record stays, and whoever takes the lock next (this process
            # too) writes back the old values of every edit of this hold
            self._lock.before_unlock = None
            self._torn.edits.forget()
            raise
