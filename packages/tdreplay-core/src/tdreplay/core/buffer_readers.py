"""One storage read by several buffers: what a write through one tells the others.

:class:`StorageReadersMixin` is one of the rooms :class:`~tdreplay.core.ReplayBuffer` is built
from. A buffer attaches itself to its storage (:mod:`~tdreplay.core.storage_readers`) and holds
the lock of the storage's readers, so the buffers of one storage take turns. Every change a
buffer makes to the storage is then passed on to the other buffers' samplers, under that lock:

- slots a write (``extend``, ``add``) filled: ``Sampler.extend(slots)``, as if written through
  them (a prioritized sampler gives them the max priority; a slice sampler takes them as the
  newest steps of the ring);
- slots an index assignment (``rb[i] = ...``) rewrote: ``Sampler.mark_update(slots)``;
- entries edited in place: ``Sampler.mark_edited(keys)``;
- ``empty()``: ``Sampler.empty()``, and their writers start again from the first row
  (``Writer.empty``: a cursor left further would write past the rows of the emptied storage,
  bringing back rows from before the ``empty``) and drop the batches drawn ahead;
- a restore (``load_state_dict``, ``loads``): ``Sampler.empty()``, then ``Sampler.extend`` of
  every written slot (the whole contents are new to them).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol, cast

import torch

from .buffer_lock import ReplayBufferLock
from .sampler import Sampler
from .storage import Storage
from .storage_readers import StorageReaders
from .transform import Compose
from .utils import as_long_tensor
from .writer import Writer

_NO_READERS = StorageReaders()  # what a buffer whose parts wait for their first use holds


class _SharableLock(AbstractContextManager[Any], Protocol):
    def share(self, thread_lock: Any) -> None: ...


class StorageReadersMixin:
    """The buffers sharing a storage hear of each other's writes (mixed into
    :class:`ReplayBuffer`)."""

    _storage: Storage
    _sampler: Sampler
    _writer: Writer
    _transform: Compose
    _readers: StorageReaders = _NO_READERS
    _lock: AbstractContextManager[Any]  # (the buffer's lock: it can share a thread lock)

    def _read_storage(self, storage: Storage) -> None:
        """Attach to ``storage`` (leaving the storage read before) and hold its readers' lock."""
        self._readers.discard(self)
        storage.attach(self)
        self._readers = storage.readers
        self._know_restores_of(storage)  # (its sampler is taken as it is)
        cast(_SharableLock, self._lock).share(self._readers.lock)

    def mark_update(self, index: Any) -> None:
        """Tell the sampler that the items at storage slots ``index`` changed, as TorchRL's
        ``mark_update``: for a change made past the buffer (``storage.set``, say).

        Writes through the buffer, and through every other buffer of the same storage, tell
        the sampler themselves. ``index`` is an int or an integer tensor of written slots (the
        ``index`` of a sample); with ``ndim > 1`` also a tuple of per-dim tensors. An index of
        an unwritten slot raises ``IndexError`` and tells the sampler nothing.

        Examples
        --------
        >>> from tdreplay.core import ListStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=ListStorage(4))
        >>> _ = rb.extend([1, 2, 3])
        >>> rb.storage.set(1, 20, set_cursor=False)
        >>> rb.mark_update(1)
        """
        with self._lock:
            slots = self._slots_of(index)
            self._sampler.mark_update(slots)

    def _slots_of(self, index: Any) -> torch.Tensor:
        """The flat written slots ``index`` names (``IndexError`` for any other)."""
        storage = self._storage
        if isinstance(index, tuple):
            shape = storage.shape
            if shape is None or len(index) != len(shape):
                raise IndexError(f"index: a tuple needs one tensor per storage dim, got "
                                 f"{len(index)} for a storage of shape {shape}.")
            parts = [as_long_tensor(part, name="index").reshape(-1) for part in index]
            if len({part.numel() for part in parts}) > 1:
                raise IndexError(f"index: the tensors of a tuple must have one entry per item, "
                                 f"got {[part.numel() for part in parts]}.")
            slots = torch.zeros_like(parts[0])
            for part, size in zip(parts, shape, strict=True):
                if part.numel() and (int(part.min()) < 0 or int(part.max()) >= size):
                    raise IndexError(f"index {index!r} is out of the storage's shape {shape}.")
                slots = slots * size + part
        else:
            slots = as_long_tensor(index, name="index").reshape(-1)
        if slots.numel() and not bool(storage.valid_slots_mask(slots).all()):
            raise IndexError(f"index {index!r} names slots that hold no item "
                             f"({len(storage)} written).")
        return slots

    # ---- the other buffers of the storage (the caller holds the shared lock) ---------------------
    def _tell_readers_written(self, slots: torch.Tensor | int) -> None:
        """Tell the others' samplers of ``slots`` a write filled."""
        if isinstance(slots, int):
            slots = torch.tensor([slots])
        for other in self._readers.others(self):
            other.sampler.extend(slots.reshape(-1))

    def _tell_readers_rewritten(self, slots: torch.Tensor) -> None:
        """Tell the others' samplers of ``slots`` an index assignment rewrote (they keep the
        slots' priorities: :meth:`~tdreplay.core.Sampler.mark_rewritten`)."""
        for other in self._readers.others(self):
            other.sampler.mark_rewritten(slots)

    def _tell_readers_edited(self, keys: list[Any] | None) -> None:
        for other in self._readers.others(self):
            other.sampler.mark_edited(keys)

    def _storage_writers(self) -> list[Writer]:
        """This buffer's writer and those of the other buffers reading its storage: what an
        ``empty`` or an in-place edit through this buffer changes the items of (each may
        refuse: ``Writer.check_empty`` / ``Writer.check_edit``, a dataset's writer does)."""
        return [self._writer, *(other.writer for other in self._readers.others(self))]

    def _tell_readers_emptied(self, empty_write_count: bool) -> None:
        for other in self._readers.others(self):
            other.clear_prefetch()
            other.sampler.empty()
            other.writer.empty(empty_write_count)
            other.transform.drop_held_items()  # (steps a MultiStepTransform held back)

    #: the storage's ``restore_count`` this buffer's sampler knows of (a restore through the
    #: buffer, or one of the buffers of the storage, tells it; one past them, at next sample);
    #: ``None`` for a sampler set onto the buffer (``set_sampler``), which may know the slots
    #: of another storage
    _seen_restores: int | None = 0
    #: the storage's ``restore_count`` when the batches drawn ahead (``prefetch``) were
    #: queued: a reset past the buffer drops them at the next sample
    _restores_seen_by_queue: int = 0
    #: the storage's ``restore_count`` the items the write-side transforms hold back belong
    #: to: a reset past the buffer drops them at the next write
    _restores_seen_by_transforms: int = 0
    #: the storage's ``restore_count`` the rate limiter's counts belong to: a reset past the
    #: buffer sets them to 0 at the next call through the limiter, as ``rb.empty()`` does
    _restores_seen_by_limiter: int = 0

    def _know_restores_of(self, storage: Storage) -> None:
        """The sampler, the batches drawn ahead, the items the transforms hold back and the
        rate limiter's counts are in step with ``storage`` now (after it was read, emptied or
        restored through this buffer)."""
        self._seen_restores = self._restores_seen_by_queue = storage.restore_count
        self._restores_seen_by_transforms = self._restores_seen_by_limiter = \
            storage.restore_count

    def _drop_held_items_of_replaced_rows(self) -> None:
        """Before a write through transforms with state: the items they hold back (a
        ``MultiStepTransform``'s steps) are dropped when the storage was emptied or restored
        past this buffer since (``rb.storage.empty()``), as ``rb.empty()`` drops them: they
        would be joined to the steps written after the reset."""
        restores = self._storage.restore_count
        if restores != self._restores_seen_by_transforms:
            self._transform.drop_held_items()
            self._restores_seen_by_transforms = restores

    def _tell_readers_restored(self) -> None:
        """After a restore through this buffer: its sampler knows the restored storage, the
        other buffers' samplers learn its written slots anew and drop the batches they drew
        ahead (of rows the restore replaced)."""
        self._know_restores_of(self._storage)
        others = self._readers.others(self)
        if not others:
            return
        for other in others:
            other.clear_prefetch()
            other.sampler.learn_written_slots(self._storage)
            other.transform.drop_held_items()  # (they would join the rows it replaced)

    def _holds_a_readers_lock(self) -> bool:
        """Whether the calling thread is inside the lock of another buffer of the storage
        (``other.locked()``), which this buffer shares."""
        readers = self._readers
        return readers.shared and any(cast(ReplayBufferLock, other.locked()).held_here
                                      for other in readers.others(self))

    def _catch_up_with_storage(self) -> None:
        """Before a save (lock held): a storage emptied or restored past this buffer since
        its sampler last knew it (``rb.storage.empty()`` / ``load_state_dict``) is learnt now,
        as the next sample would learn it, and the writer attaches to it again (a round-robin
        cursor past its rows moves back to their end, where its next write goes), so that the
        saved sampler and writer states fit the saved storage (else they held slots, or a
        cursor, past its rows: a state no buffer loads)."""
        seen = self._seen_restores
        if seen is not None and self._storage.restore_count != seen:
            self._learn_restored_storage()
            self._writer.register_storage(self._storage)

    def _learn_restored_storage(self) -> None:
        """The storage was restored past this buffer (``rb.storage.load_state_dict`` /
        ``loads``, as TorchRL programs do) and the sampler drew a slot it no longer holds
        (a prioritized sampler raised at every sample): the sampler forgets what it knew and
        learns the written slots anew, as after a restore through another buffer of the
        storage. The lock is held."""
        self._seen_restores = self._storage.restore_count
        self._sampler.learn_written_slots(self._storage)
