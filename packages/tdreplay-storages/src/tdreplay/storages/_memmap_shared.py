"""The state every process sharing a ``LazyMemmapStorage`` maps: counters and the write lock.

``_SharedCounters``: ``_STATE_SIZE`` int64 counters in ``tdreplay-memmap-state.bin`` (written
rows, the writer's cursor and write count, a torn overwrite in flight, the write revision, the
count of resets);
``_ProcessLock``: a re-entrant lock across threads (a thread lock) and processes (``flock``),
which drops the rows a writer that died left torn (or writes back the old values of the rows
an editor that died left half edited) as it is taken (:meth:`_ProcessLock.watch`), and clears
the record of the in-place edits of a hold as it is released (``before_unlock``);
``SharedStateMixin``: what ``LazyMemmapStorage`` reads and writes through them (its row count,
``process_lock``, ``shared_writer_counters()``, ``revision``, ``shared_reset_count()``, the guard
of its in-place edits).

Torn rows are never counted nor read: every read and write of the storage, and every draw of a
buffer holding it, runs under the lock, whose first acquisition in a thread checks the torn
record (one read of a shared counter) and recovers when it is set; a read that may run
without the lock (``len()``, ``state_dict()``, a direct ``get_trusted``) takes it when the
record is set and no thread of its process holds it: that waits for a write in flight in
another process, or drops the rows of a dead one.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from tdreplay.core import RevisionTracking
from tdreplay.core.atomic_files import replace_file

from ._shared_edits import SharedEdit
from ._storage_errors import DamagedStorageError
from ._torn_writes import STATE_RESETS, STATE_TORN, STATE_TORN_WRITES, TornWrites

try:  # POSIX
    import fcntl
except ImportError:  # pragma: no cover - Windows: exclusion within a process only
    fcntl = None  # type: ignore[assignment]

_STATE_FILE = "tdreplay-memmap-state.bin"

# slots of the shared state array
_STATE_INIT = 0  # 1 once the layout file is written
_STATE_LEN = 1  # written rows
_STATE_CURSOR = 2  # writer cursor  } handed to writers as shared_writer_counters()
_STATE_WRITES = 3  # write count    }
_STATE_TORN = STATE_TORN  # 4, 5, 6: an overwrite in flight (see _torn_writes.py)
_STATE_REVISION = 7  # Storage.revision, advanced by the writes of every process
_STATE_RESETS = STATE_RESETS  # 8: Storage.shared_reset_count(): empties, restores, recoveries
_STATE_LAST_ROW = 9  # Storage.last_written_row + 1 (-1: None; 0: not recorded, an older file)
_STATE_TORN_WRITES = STATE_TORN_WRITES  # 10: the write count + 1 when a write's record was made
_STATE_SIZE = 11
_OLDER_STATE_SIZES = (8, 9)  # (before 0.2.1: no reset count; storages before 0.6.6: no last row)


class _SharedCounters:
    """``_STATE_SIZE`` int64 counters in a small file that every process maps (``MAP_SHARED``).

    Pickles as its path, so an unpickled copy maps the same file.
    """

    def __init__(self, path: str, create: bool = False) -> None:
        self.path = str(path)
        if create:
            replace_file(self.path, np.zeros(_STATE_SIZE, dtype=np.int64).tobytes(), durable=False)
        elif not os.path.exists(self.path):  # (unpickled: the storage's files are gone)
            raise FileNotFoundError(
                f"the files of this LazyMemmapStorage are gone ({os.path.dirname(self.path)} "
                "holds no storage any more): a pickled memory-mapped storage maps the files of "
                "the storage it was pickled from, for a process that runs while that storage "
                "exists (one built without scratch_dir removes its temporary directory when "
                "it is freed). To keep a buffer, save it with rb.dumps(path) (or state_dict) "
                "and load that, or give the storage a scratch_dir.")
        else:
            size = os.path.getsize(self.path)
            if size in [n * 8 for n in _OLDER_STATE_SIZES]:  # (made by an older version)
                with open(self.path, "r+b") as f:  # the counters added since start at 0
                    f.truncate(_STATE_SIZE * 8)
            elif size != _STATE_SIZE * 8:  # cut short (or grown): counters lost or unknown
                raise DamagedStorageError(
                    f"the state file {self.path} holds {size} bytes, not the "
                    f"{_STATE_SIZE * 8} of a storage's counters (nor the "
                    f"{' or '.join(str(n * 8) for n in _OLDER_STATE_SIZES)} of an older "
                    "version's): its row count, cursor and "
                    "write count are lost. Nothing was changed; put the file back (or remove "
                    "the directory to start afresh).")
        # a plain ndarray view of the shared mapping: indexing it skips np.memmap's
        # Python-level __getitem__ (len() and every write read these counters)
        self.array = np.memmap(self.path, dtype=np.int64, mode="r+",
                               shape=(_STATE_SIZE,)).view(np.ndarray)
        #: the same memory as a memoryview: indexing it returns / takes plain ints, about
        #: three times faster than the ndarray (the hot paths read and write through it)
        self.view = self.array.data

    def __reduce__(self) -> tuple:
        return (_SharedCounters, (self.path,))


_INIT_LOCK = threading.Lock()
#: forks on the way to this process (one more in each child): a lock opened at another count
#: was opened by an ancestor (see _ProcessLock.held)
_FORKS = [0]


def _count_fork() -> None:
    _FORKS[0] += 1


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_count_fork)


class _ProcessLock:
    """A re-entrant lock held by one thread of one process at a time.

    A thread lock serialises the threads of a process; ``flock(LOCK_EX)`` on a lock file
    serialises processes. Each process opens the file itself (a forked child re-opens it:
    ``flock`` locks belong to an open file description, which a fork would share).

    A child forked inside the lock (``with rb.locked():`` around the fork) does not hold it:
    its parent does. The child's exits of the levels it inherited give nothing back (giving
    back the shared description's lock would let a third process in while the parent is still
    inside), and each of its calls takes the lock itself, waiting for the parent to leave.
    """

    def __init__(self, path: str) -> None:
        self.path = str(path)
        self._pid: int | None = None  # the process that opened _fd (None: not opened yet)
        self._fd = -1
        self._thread_lock = threading.RLock()
        self._depth = 0
        #: levels a forked child inherited from the thread that forked inside the lock: its
        #: exits of them (outermost, so after its own) release nothing (see the class doc)
        self._inherited = 0
        self._opened_after = -1  # _FORKS[0] when _fd was opened (see held)
        self._counters: memoryview | None = None  # the shared state whose torn record is checked
        self._recover: weakref.WeakMethod | None = None
        #: called once as the holding thread releases the lock for good (set by an in-place
        #: edit: it clears the edits' record, see ``_torn_writes``), then forgotten
        self.before_unlock: Callable[[], Any] | None = None

    def watch(self, counters: memoryview, recover: Callable[[], Any]) -> None:
        """From now on, each time a thread takes the lock (not re-entering it), call ``recover``
        (a bound method, held weakly) before anything else if ``counters[_STATE_TORN]`` is set:
        the record of an overwrite left unfinished, its writer dead (a live writer holds the
        lock, or has cleared it). A ``recover`` that raises releases the lock and propagates."""
        self._counters = counters
        self._recover = weakref.WeakMethod(recover)

    @property
    def held(self) -> bool:
        """Whether a thread of this process holds the lock (not a process it was forked from:
        a child inherits the parent's count of holders, and holds nothing until it opens the
        lock file itself)."""
        return self._depth > 0 and self._opened_after == _FORKS[0]

    def _ensure_open(self) -> None:
        pid = os.getpid()
        if self._pid == pid:
            return
        with _INIT_LOCK:
            if self._pid == pid:
                return
            inherited = self._fd
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            if inherited >= 0:  # a fork's copy of the parent's descriptor (closing it leaves
                os.close(inherited)  # the parent's lock on the description as it is)
                self._inherited = self._depth + self._inherited
            self._thread_lock = threading.RLock()
            self._depth = 0
            self._opened_after = _FORKS[0]
            self.before_unlock = None  # (a fork's copy of the parent's edits)
            self._pid = pid

    def acquire(self) -> None:
        self._ensure_open()
        self._thread_lock.acquire()
        if self._depth:
            self._depth += 1
            return
        if fcntl is not None:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX)
            except BaseException:
                self._thread_lock.release()
                raise
        self._depth = 1
        counters = self._counters
        if counters is not None and counters[_STATE_TORN]:  # one read: the hot paths' cost
            self._recover_torn()

    def _recover_torn(self) -> None:
        """Run the watched recovery (the lock just taken); release the lock if it raises."""
        ref = self._recover
        recover = ref() if ref is not None else None
        if recover is None:
            return
        try:
            recover()
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        if self._opened_after != _FORKS[0] or not self._depth:  # (a fork since it opened)
            self._ensure_open()
            if not self._depth and self._inherited:  # a level a forked child inherited
                self._inherited -= 1
                return
        settle = self.before_unlock
        try:
            if settle is not None and self._depth == 1:  # (before another process may lock)
                self.before_unlock = None
                settle()
        finally:
            self._depth -= 1
            if self._depth == 0 and fcntl is not None:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            self._thread_lock.release()

    def __enter__(self) -> _ProcessLock:
        self.acquire()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.release()

    def __reduce__(self) -> tuple:
        return (_ProcessLock, (self.path,))

    def __del__(self) -> None:
        if self._fd >= 0 and self._pid == os.getpid():
            try:
                os.close(self._fd)
            except OSError:
                pass


class SharedStateMixin(RevisionTracking):
    """Row count, lock, writer counters and revision of a storage kept in the shared state
    file (mixed into :class:`~tdreplay.storages.LazyMemmapStorage`)."""

    # attributes with class defaults, read as attributes (never through ``__dict__``, which
    # would slow down every attribute read of the storage: see tdreplay.core.buffer_parts)
    #: ``None`` only during ``__init__``, before the state file is mapped
    _state: _SharedCounters = None  # type: ignore[assignment]
    _own_last_written_row: int | None = None
    _lock_obj: _ProcessLock
    _torn: TornWrites  # (the storage's record of rows being overwritten or edited)
    rows_capacity: int | None  # (the storage's)

    @property
    def process_lock(self) -> _ProcessLock:
        """Re-entrant lock excluding other threads and processes (buffers take it)."""
        return self._lock_obj

    def shared_writer_counters(self) -> np.ndarray:
        """``[cursor, write_count]`` in shared memory: writers keep their counters there."""
        return self._state.array[_STATE_CURSOR:_STATE_WRITES + 1]

    @property
    def last_written_row(self) -> int | None:
        """:attr:`~tdreplay.core.Storage.last_written_row` for every process that maps this
        storage, kept in the shared state file: the row the last write that records it
        reached (``set_cursor=True``), in any process and by any writer. A state file of an
        older version, which did not record it: the row before the shared writer cursor once
        a writer keeping its counters here has written."""
        state = self._state
        if state is None:  # (during __init__)
            return self._own_last_written_row
        recorded: int = state.view[_STATE_LAST_ROW]
        if recorded:
            return None if recorded < 0 else recorded - 1
        rows = self.rows_capacity
        if not state.view[_STATE_WRITES] or not rows:
            return self._own_last_written_row
        return (int(state.view[_STATE_CURSOR]) - 1) % rows

    @last_written_row.setter
    def last_written_row(self, row: int | None) -> None:
        self._own_last_written_row = row
        state = self._state
        if state is not None:
            state.view[_STATE_LAST_ROW] = -1 if row is None else int(row) + 1

    @property
    def revision(self) -> int:
        """:attr:`~tdreplay.core.Storage.revision`, kept in the shared state file: a write by
        any process that maps this storage advances it."""
        state = self._state
        if state is None:  # during __init__, before the state file is mapped
            return super().revision
        value: int = state.view[_STATE_REVISION]
        return value

    def bump_revision(self) -> None:
        """Advance :attr:`revision` in the shared state file (under the process lock, so that
        writers of several processes never lose a step)."""
        state = self._state
        if state is None:
            super().bump_revision()
            return
        with self._lock_obj:
            state.view[_STATE_REVISION] += 1

    def shared_reset_count(self) -> int:
        """:meth:`~tdreplay.core.Storage.shared_reset_count`, kept in the shared state file:
        ``empty``, ``load_state_dict`` and a checkpoint's ``install`` in any process that maps
        this storage advance it, and so does dropping the rows a writer that died left torn
        (the rows after them move down).

        Examples
        --------
        >>> import torch
        >>> from tdreplay.storages import LazyMemmapStorage
        >>> s = LazyMemmapStorage(4)
        >>> s.set(slice(0, 2), torch.arange(2))
        >>> before = s.shared_reset_count()
        >>> s.set(slice(2, 4), torch.arange(2))  # writes leave it
        >>> s.shared_reset_count() == before
        True
        >>> s.empty()
        >>> s.shared_reset_count() == before
        False
        """
        value: int = self._state.view[_STATE_RESETS]
        return value

    def _count_reset(self) -> None:
        """Advance :meth:`shared_reset_count` (under the process lock: never a lost step)."""
        with self._lock_obj:
            self._state.view[_STATE_RESETS] += 1

    # the wholesale replacements of the rows (of the storage this is mixed into): each counts
    def empty(self) -> None:
        super().empty()  # type: ignore[misc]
        self._count_reset()

    def install(self, meta: dict[str, Any], data: Any) -> None:
        super().install(meta, data)  # type: ignore[misc]
        self._count_reset()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)  # type: ignore[misc]
        self._count_reset()

    def _edit_guard(self) -> SharedEdit:
        """An in-place edit of the written rows runs under the process lock, its rows recorded
        before they are written (:mod:`~tdreplay.storages._shared_edits`)."""
        return SharedEdit(self._lock_obj, self._torn)

    # the row count and the layout live in the scratch directory, shared by every process
    def _rows_written(self) -> int:
        view = self._state.view
        if view[_STATE_TORN] and not self._lock_obj.held:
            # counted rows being overwritten by another process, or left torn by one that
            # died: the count once that write is done, or once its rows are dropped
            with self._lock_obj:
                settled: int = view[_STATE_LEN]
                return settled
        count: int = view[_STATE_LEN]
        return count

    def _set_rows_written(self, rows: int) -> None:
        self._state.view[_STATE_LEN] = rows
