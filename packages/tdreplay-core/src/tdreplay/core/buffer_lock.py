"""The lock of a replay buffer: what ``rb.locked()`` returns.

:class:`BufferLock` is what code composing buffers (an ensemble, a service) may use of it: a
re-entrant context manager, and :meth:`~BufferLock.enter_if_free` to take several buffers'
locks without waiting while holding some (the way out of lock-order deadlocks: take all that
are free, or give back what was taken and wait for the busy one holding nothing).
:class:`ReplayBufferLock` is the lock of a :class:`~tdreplay.core.ReplayBuffer`.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any, Protocol

from .fork_safety import ForkGuard, guard_forks, left_locked, refusing_lock

if TYPE_CHECKING:
    from .replay_buffer import ReplayBuffer


class BufferLock(Protocol):
    """What ``rb.locked()`` returns: a re-entrant context manager (per thread) that also
    enters without waiting when it is free."""

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc_info: Any) -> None: ...

    def enter_if_free(self) -> bool:
        """Enter as ``with`` does, or return ``False`` at once (nothing taken) when another
        thread holds the lock."""


class ReplayBufferLock(ForkGuard):
    """The buffer's lock: a re-entrant thread lock, plus the storage's ``process_lock`` if any.

    A storage shared between processes (e.g. ``LazyMemmapStorage``) exposes a re-entrant
    ``process_lock`` (``acquire()`` / ``release()``); holding it around the writer's read of its
    cursor, the write and the counters' update makes an ``extend`` atomic across processes, and
    a sample in one process never reads a row half-written by another.

    Across a fork, the forking thread holds the thread lock (:mod:`~tdreplay.core.fork_safety`):
    a forked child gets the buffer between two calls.
    """

    __slots__ = ("_thread_lock", "_buffer", "_held", "_owner", "__weakref__")

    def __init__(self, buffer: ReplayBuffer) -> None:
        self._thread_lock = threading.RLock()
        # weak: the buffer holds its lock, and a cycle would keep the buffer (and its storage's
        # memory) alive after its last reference goes, until a gc pass
        self._buffer = weakref.ref(buffer)
        #: what the thread inside (one at a time) took at each level of its ``with`` blocks
        self._held: list[Any] = []
        self._owner: int | None = None  # that thread's ident (None: no thread inside)
        guard_forks(self)

    @property
    def held_here(self) -> bool:
        """Whether the calling thread is inside the lock."""
        return self._owner == threading.get_ident()

    def share(self, thread_lock: Any) -> None:
        """Hold ``thread_lock`` from now on: the lock of the buffers reading the same storage
        (:mod:`~tdreplay.core.storage_readers`).

        Called from inside the lock (``set_storage``), the calling thread moves to the new
        lock at once: it takes ``thread_lock`` once per level it holds the old one and then
        gives the old one back, so no other thread gets in between, and its exits release the
        new lock. A thread that was waiting for the old lock finds, once it has it, that the
        buffer has moved on, gives it back and waits for the new one (``__enter__``).
        """
        old = self._thread_lock
        if thread_lock is old:
            return
        held = self._held  # (only the thread inside can be here: share runs under the lock)
        for _ in held:
            thread_lock.acquire()
        self._thread_lock = thread_lock
        self._held = [(thread_lock, process_lock) for _, process_lock in held]
        for _ in held:
            old.release()

    def __enter__(self) -> ReplayBufferLock:
        while True:
            thread_lock = self._thread_lock
            thread_lock.acquire()
            if thread_lock is self._thread_lock:
                break
            thread_lock.release()  # the buffer moved to another lock (share) while we waited
        self._enter_process_lock(thread_lock)
        return self

    def enter_if_free(self) -> bool:
        """Enter the lock as ``with`` does unless another thread of this process holds it:
        then return ``False`` at once, having taken nothing. (The storage's process lock, when
        another process holds it, is waited for.)

        Examples
        --------
        >>> from tdreplay.core import ListStorage, ReplayBuffer
        >>> lock = ReplayBuffer(storage=ListStorage(4)).locked()
        >>> lock.enter_if_free(), lock.enter_if_free()  # (re-entrant: the same thread)
        (True, True)
        >>> lock.__exit__(None, None, None); lock.__exit__(None, None, None)
        """
        thread_lock = self._thread_lock
        if not thread_lock.acquire(blocking=False):
            return False
        if thread_lock is not self._thread_lock:  # (moved to another lock: try that one)
            thread_lock.release()
            return self.enter_if_free()
        self._enter_process_lock(thread_lock)
        return True

    def _enter_process_lock(self, thread_lock: Any) -> None:
        """Take the storage's process lock (``thread_lock`` held), and record the level."""
        buffer = self._buffer()
        process_lock = buffer.storage.process_lock if buffer is not None else None
        if process_lock is not None:
            try:
                process_lock.acquire()
            except BaseException:
                thread_lock.release()
                raise
        if not self._held:
            self._owner = threading.get_ident()
        self._held.append((thread_lock, process_lock))

    def __exit__(self, *exc_info: Any) -> None:
        thread_lock, process_lock = self._held.pop()
        if not self._held:
            self._owner = None  # (before the lock goes: the next thread sets its own)
        try:
            if process_lock is not None:
                process_lock.release()
        finally:
            thread_lock.release()

    # ---- across a fork (ForkGuard) ---------------------------------------------------------------
    def hold(self, timeout: float | None = None) -> bool:
        return bool(self._thread_lock.acquire(timeout=timeout or 0))  # (0: without waiting)

    def release(self) -> None:
        self._thread_lock.release()

    def reset_in_child(self, held: bool) -> None:
        if not held and left_locked(self._thread_lock):
            self._thread_lock = refusing_lock("This replay buffer")
            self._held, self._owner = [], None
