"""The buffers that read one storage (TorchRL's ``Storage.attach``).

Several buffers may be built on one storage: a prioritized buffer and a uniform one over the same
data, say. Each buffer attaches itself to its storage (:meth:`AttachableStorage.attach`), and the
buffers of one storage then

- share one lock (:attr:`StorageReaders.lock`), so that no buffer reads a row another is
  writing, and
- hear of each other's writes: a write through any of them tells the others' samplers which
  slots changed (:mod:`~tdreplay.core.buffer_readers`), as TorchRL's writers tell every
  attached buffer. A prioritized sampler gives the rewritten slots the max priority, a slice
  sampler takes them into its trajectories. Without it, the other buffer's prioritized sampler
  would keep drawing a rewritten slot with the old item's priority;
- hear of a reset made past them (``rb.storage.empty()``, ``rb.storage.loads(path)``): it runs
  under their lock, and each buffer's sampler, writer, batches drawn ahead, held-back items and
  rate-limiter counts follow at once (:meth:`StorageReaders.tell_rows_replaced`).

Buffers are held by weak reference (a buffer gone is no longer told) and the readers are not
pickled: a copy of a storage has none until a buffer takes it (a copied buffer attaches to its
copy of the storage).
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["AttachableStorage", "StorageReaders"]

_CREATING = threading.Lock()  # one StorageReaders per storage, however many threads ask


class StorageReaders:
    """The buffers reading one storage, the lock they share, and who hears of a reset.

    Examples
    --------
    >>> from tdreplay.core import ListStorage, ReplayBuffer
    >>> storage = ListStorage(8)
    >>> a, b = ReplayBuffer(storage=storage), ReplayBuffer(storage=storage)
    >>> storage.readers.shared, storage.readers.others(a) == [b]
    (True, True)
    """

    __slots__ = ("lock", "shared", "_entries", "_replacers")

    def __init__(self) -> None:
        #: the re-entrant lock every buffer of the storage holds to write or read it
        self.lock = threading.RLock()
        #: whether more than one buffer was attached (a buffer gone may leave it ``True``:
        #: :meth:`others` then finds no one to tell)
        self.shared = False
        # (each buffer, by weak reference, with its rows-replaced hook or None)
        self._entries: list[tuple[weakref.ref[Any], weakref.WeakMethod[Any] | None]] = []
        self._replacers: tuple[Any, ...] = ()  # the buffers replacing the rows (replaced_by)

    def __reduce__(self) -> tuple[Any, ...]:
        return (StorageReaders, ())  # a copy of the storage is read by no buffer yet

    def add(self, buffer: Any, on_rows_replaced: Callable[[Any], None] | None = None) -> None:
        """Count ``buffer`` among the readers (once); ``on_rows_replaced(storage)``, a method of
        ``buffer``, is called when the storage's rows are replaced past it
        (:meth:`tell_rows_replaced`)."""
        with self.lock:
            self._entries = [entry for entry in self._entries if entry[0]() is not None]
            known = next((i for i, (ref, _) in enumerate(self._entries) if ref() is buffer), None)
            if on_rows_replaced is None and known is not None:
                return  # (attached already: keep its hook)
            hook = None if on_rows_replaced is None else weakref.WeakMethod(on_rows_replaced)
            entry = (weakref.ref(buffer), hook)
            if known is None:
                self._entries.append(entry)
            else:
                self._entries[known] = entry
            self.shared = len(self._entries) > 1

    def discard(self, buffer: Any) -> None:
        """Stop counting ``buffer`` (it took another storage)."""
        with self.lock:
            self._entries = [entry for entry in self._entries
                             if entry[0]() not in (None, buffer)]
            self.shared = len(self._entries) > 1

    def buffers(self) -> list[Any]:
        """The buffers reading the storage, in the order they attached."""
        return [buffer for buffer in (ref() for ref, _ in self._entries) if buffer is not None]

    def others(self, buffer: Any) -> list[Any]:
        """The buffers reading the storage besides ``buffer``."""
        return [other for other in self.buffers() if other is not buffer]

    @contextlib.contextmanager
    def replaced_by(self, buffer: Any) -> Iterator[None]:
        """While ``buffer`` replaces the storage's rows itself (its ``empty``, its restore, or
        those of an ensemble it is a member of), with the lock held: it is not told of it
        (:meth:`tell_rows_replaced`), the others are."""
        previous = self._replacers
        self._replacers = (*previous, buffer)
        try:
            yield
        finally:
            self._replacers = previous

    def tell_rows_replaced(self, storage: Any) -> None:
        """Every row of ``storage`` was replaced (emptied or restored; the lock is held): call
        the hook of each buffer reading it (but the one that replaced them, which knows), so
        that its sampler, writer, batches drawn ahead and held-back items follow at once. A
        hook that raises does not keep the others from being told: the first error is raised
        once every buffer has heard of it."""
        failed: Exception | None = None
        for ref, hook_ref in list(self._entries):
            hook = hook_ref() if hook_ref is not None else None
            buffer = ref()
            if hook is not None and not any(buffer is by for by in self._replacers):
                try:
                    hook(storage)
                except Exception as err:  # noqa: BLE001 - raised below, once all are told
                    failed = failed or err
        if failed is not None:
            raise failed


class AttachableStorage:
    """TorchRL's ``Storage.attach`` (a base of :class:`~tdreplay.core.Storage`)."""

    # made at the first use; read and set as a plain attribute (never through ``__dict__``,
    # which would slow down every other attribute read of the storage on the hot paths)
    _readers: StorageReaders | None = None

    @property
    def readers(self) -> StorageReaders:
        """The buffers that read this storage and the lock they share (see the module)."""
        readers = self._readers
        if readers is None:
            with _CREATING:
                readers = self._readers
                if readers is None:
                    readers = self._readers = StorageReaders()
        return readers

    def attach(self, buffer: Any) -> None:
        """Count ``buffer`` among the buffers reading this storage, as TorchRL's ``attach``.

        A buffer attaches itself to its storage when it is built (or given the storage with
        ``set_storage``), so a program does not need to call this. The buffers of one storage
        share a lock, and a write through any of them tells the others' samplers which slots
        changed.

        Examples
        --------
        >>> from tdreplay.core import ListStorage, ReplayBuffer
        >>> storage = ListStorage(8)
        >>> rb = ReplayBuffer(storage=storage)
        >>> storage.attached_buffers == [rb]
        True
        """
        self.readers.add(buffer)

    @property
    def attached_buffers(self) -> list[Any]:
        """The buffers reading this storage, in the order they attached."""
        return self.readers.buffers()
