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
  would keep drawing a rewritten slot with the old item's priority.

Buffers are held by weak reference (a buffer gone is no longer told) and the readers are not
pickled: a copy of a storage has none until a buffer takes it (a copied buffer attaches to its
copy of the storage).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

__all__ = ["AttachableStorage", "StorageReaders"]

_CREATING = threading.Lock()  # one StorageReaders per storage, however many threads ask


class StorageReaders:
    """The buffers reading one storage and the lock they share.

    Examples
    --------
    >>> from tdreplay.core import ListStorage, ReplayBuffer
    >>> storage = ListStorage(8)
    >>> a, b = ReplayBuffer(storage=storage), ReplayBuffer(storage=storage)
    >>> storage.readers.shared, storage.readers.others(a) == [b]
    (True, True)
    """

    __slots__ = ("lock", "shared", "_refs")

    def __init__(self) -> None:
        #: the re-entrant lock every buffer of the storage holds to write or read it
        self.lock = threading.RLock()
        #: whether more than one buffer was attached (a buffer gone may leave it ``True``:
        #: :meth:`others` then finds no one to tell)
        self.shared = False
        self._refs: list[weakref.ref[Any]] = []

    def __reduce__(self) -> tuple[Any, ...]:
        return (StorageReaders, ())  # a copy of the storage is read by no buffer yet

    def add(self, buffer: Any) -> None:
        """Count ``buffer`` among the readers (once)."""
        with self.lock:
            self._refs = [ref for ref in self._refs if ref() is not None]
            if not any(ref() is buffer for ref in self._refs):
                self._refs.append(weakref.ref(buffer))
            self.shared = len(self._refs) > 1

    def discard(self, buffer: Any) -> None:
        """Stop counting ``buffer`` (it took another storage)."""
        with self.lock:
            self._refs = [ref for ref in self._refs if ref() not in (None, buffer)]
            self.shared = len(self._refs) > 1

    def buffers(self) -> list[Any]:
        """The buffers reading the storage, in the order they attached."""
        return [buffer for buffer in (ref() for ref in self._refs) if buffer is not None]

    def others(self, buffer: Any) -> list[Any]:
        """The buffers reading the storage besides ``buffer``."""
        return [other for other in self.buffers() if other is not buffer]


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
