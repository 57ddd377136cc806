"""Buffers across ``os.fork``: a forked child gets each buffer in a state it was in, lock free.

A fork copies only the thread that forks. A lock held at that moment by another thread (a
prefetch worker drawing ahead, a collector thread in ``extend``, a learner updating
priorities) would stay held for good in the child, whose first call on that buffer would hang,
and the state it guards could be half-changed. So, just before a fork (``os.fork``, and
``multiprocessing`` with the ``fork`` start method), the forking thread takes every guarded
lock and gives them back in both processes just after: the child starts from a state the
parent was in between two operations, with its locks free. Threads do not survive a fork: in
the child, each guard also drops what belonged to its parent's threads (a prefetch worker's
queue of batches not drawn yet, the submitted priority updates not applied yet: those are the
parent's).

The forking thread never waits for a lock while it holds another (a thread holding one lock
while waiting for another could then wait for it for good): it takes the free locks, and when
one is busy gives back those it took, waits for that one alone, and tries the others again.
Once it holds them all, it waits for the work that ends without a lock (a batch drawn ahead
whose draw is over but not its making: :meth:`~ForkGuard.settled`). All of it for at most
:data:`FORK_WAIT_S` seconds. Past that (another thread keeps a lock longer, or waits for one
the forking thread holds), the fork goes on, and in the child each lock still held by a thread
of the parent refuses every call with :class:`LeftLockedByFork` (a ``RuntimeError``) instead
of hanging.

A component that keeps a lock of its own subclasses :class:`ForkGuard` and registers each
instance with :func:`guard_forks` (weakly: a guard gone is forgotten).

Examples
--------
>>> from tdreplay.core import ListStorage, ReplayBuffer
>>> from tdreplay.core.testing import in_forked_child
>>> rb = ReplayBuffer(storage=ListStorage(10), batch_size=2, prefetch=2)
>>> _ = rb.extend(list(range(10)))
>>> _ = rb.sample()  # the prefetch worker draws two more batches ahead, under the lock
>>> in_forked_child(lambda: len(rb.sample()))  # the child samples, whatever the worker did
2
"""

from __future__ import annotations

import os
import time
import weakref
from typing import Any

__all__ = [
    "FORK_WAIT_S",
    "ForkGuard",
    "LeftLockedByFork",
    "guard_forks",
    "left_locked",
    "refusing_lock",
]

#: how long a fork waits, at most, for the guarded locks to be free all at once
FORK_WAIT_S = 10.0


class LeftLockedByFork(RuntimeError):
    """A lock that another thread held when this process forked (see
    :mod:`tdreplay.core.fork_safety`): what it guards may be half-changed."""


class ForkGuard:
    """What a component does around a fork: take its locks, give them back, and in the child
    drop what belonged to the parent's threads. Subclass and register with
    :func:`guard_forks`.

    Examples
    --------
    >>> import threading
    >>> class Counter(ForkGuard):
    ...     def __init__(self):
    ...         self.lock = threading.RLock()
    ...         guard_forks(self)
    ...     def hold(self, timeout=None):
    ...         return self.lock.acquire(timeout=timeout or 0)
    ...     def release(self):
    ...         self.lock.release()
    ...     def reset_in_child(self, held):
    ...         if not held and left_locked(self.lock):
    ...             self.lock = refusing_lock("the counter")
    >>> counter = Counter()
    >>> counter.hold(), counter.release()
    (True, None)
    """

    __slots__ = ()

    def hold(self, timeout: float | None = None) -> bool:
        """Take the locks: without waiting (``timeout`` None), or waiting at most ``timeout``
        seconds (the caller holds no other guard then). ``False``, and nothing taken, when
        one stayed busy. The default holds nothing (a guard of work the other guards' locks
        hold still, e.g. a prefetch queue)."""
        return True

    def settled(self, timeout: float) -> bool:
        """Called once every guard is held: whether, within ``timeout`` seconds, what this
        one guards is between two operations (``True`` by default). ``False``: the fork gives
        everything back and tries again."""
        return True

    def release(self) -> None:
        """Give back what :meth:`hold` took (in the parent and in the child)."""

    def reset_in_child(self, held: bool) -> None:
        """In the child, after :meth:`release`: drop the parent's threads and their work.
        ``held``: whether :meth:`hold` succeeded before the fork (``False``: a lock may be
        held for good, see :func:`left_locked`)."""


class _Refusing:
    """Stands in the child for a lock another thread of the parent held at the fork."""

    __slots__ = ("_what",)

    def __init__(self, what: str) -> None:
        self._what = what

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        raise LeftLockedByFork(
            f"{self._what} was in use by another thread when this process forked (it kept the "
            f"lock more than {FORK_WAIT_S:g} s, or waited for one the forking thread held); "
            "its copy in this process may be half-changed and cannot be used. Fork when no "
            "other thread is inside a call on it, or start the process with the 'spawn' "
            "method and pass it the buffer.")

    def release(self) -> None:
        raise LeftLockedByFork(f"{self._what} cannot be used in this process (see acquire).")

    __enter__ = acquire

    def __exit__(self, *exc_info: Any) -> None:
        self.release()


def refusing_lock(what: str) -> Any:
    """A stand-in, in a forked child, for a lock left held by a thread of the parent: every
    use raises :class:`LeftLockedByFork` naming ``what`` (instead of waiting for good).

    Examples
    --------
    >>> with refusing_lock("the buffer"):  # doctest: +ELLIPSIS
    ...     pass
    Traceback (most recent call last):
    ...
    tdreplay.core.fork_safety.LeftLockedByFork: the buffer was in use by another thread ...
    """
    return _Refusing(what)


def left_locked(lock: Any) -> bool:
    """In a forked child: whether ``lock`` (a ``threading`` lock) is held by a thread of the
    parent, so for good (the calling thread, the only one, does not hold it).

    Examples
    --------
    >>> import threading
    >>> lock = threading.RLock()
    >>> left_locked(lock)
    False
    """
    if not lock.acquire(blocking=False):
        return True
    lock.release()
    return False


_guards: weakref.WeakSet[ForkGuard] = weakref.WeakSet()
_held: list[ForkGuard] = []  # the guards taken by the fork in progress (this thread's)


def guard_forks(guard: ForkGuard) -> None:
    """Call ``guard``'s :meth:`~ForkGuard.hold` before each fork of this process, and its
    :meth:`~ForkGuard.release` (then :meth:`~ForkGuard.reset_in_child` in the child) after,
    for as long as it lives."""
    _guards.add(guard)


def _live_guards() -> list[ForkGuard]:
    while True:
        try:
            return list(_guards)
        except RuntimeError:  # another thread made a guard meanwhile
            continue


def _hold_all() -> list[ForkGuard]:
    """Take every guard and wait for each to be settled; the guards taken (all, unless time
    ran out: then those free at that moment)."""
    deadline = time.monotonic() + FORK_WAIT_S
    waited: ForkGuard | None = None  # taken by a wait while nothing else was held
    while True:
        guards = _live_guards()
        held = [] if waited is None else [waited]
        busy = None
        for guard in guards:
            if guard is not waited:
                if not guard.hold():
                    busy = guard
                    break
                held.append(guard)
        left = deadline - time.monotonic()
        if busy is None and (left <= 0 or all(g.settled(max(left, 0.0)) for g in guards)):
            return held
        for guard in reversed(held):
            guard.release()
        waited = None
        left = deadline - time.monotonic()
        if left <= 0:
            return [guard for guard in _live_guards() if guard.hold()]
        if busy is not None and busy.hold(timeout=left):
            waited = busy


def _before_fork() -> None:
    _held[:] = _hold_all()


def _release_held() -> list[ForkGuard]:
    held, _held[:] = list(_held), []
    for guard in reversed(held):
        guard.release()
    return held


def _after_fork_in_parent() -> None:
    _release_held()


def _after_fork_in_child() -> None:
    held = {id(guard) for guard in _release_held()}
    for guard in list(_guards):
        guard.reset_in_child(id(guard) in held)


if hasattr(os, "register_at_fork"):  # POSIX; where it is missing no process forks
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                        after_in_child=_after_fork_in_child)
