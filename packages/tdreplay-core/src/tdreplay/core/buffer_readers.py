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
- ``empty()`` and a restore (``load_state_dict``, ``loads``), through a buffer or made past
  them on the storage itself (``rb.storage.empty()``): the storage runs it under the lock and
  tells every buffer but the one making it (:meth:`StorageReadersMixin._rows_replaced_past`):
  their samplers learn the written slots anew (none after an ``empty``), their writers attach
  again (a cursor left further would write past the rows of the emptied storage, bringing back
  rows from before the ``empty``), the batches they drew ahead and the items their transforms
  hold back are dropped, their rate limiters count from 0.
"""

from __future__ import annotations

import contextlib
import operator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch

from .buffer_lock import ReplayBufferLock
from .rate_limit import RateLimiter
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
    _rate_limiter: RateLimiter | None

    if TYPE_CHECKING:  # what the buffer this is mixed into provides
        def clear_prefetch(self) -> None: ...

    def _read_storage(self, storage: Storage) -> None:
        """Attach to ``storage`` (leaving the storage read before) and hold its readers' lock."""
        self._readers.discard(self)
        self._readers = storage.readers  # (what storage.attach(self) adds to, with the hook)
        self._readers.add(self, on_rows_replaced=self._rows_replaced_past)
        self._sampler_taken_as_is = False
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

    def _check_storage_writers(self, action: str) -> None:
        """Ask this buffer's writer, then those of the other buffers reading its storage,
        whether ``action`` (``"empty"`` or ``"edit"``: ``Writer.check_empty`` /
        ``Writer.check_edit``) may change the storage's items; each may refuse (a dataset's
        writer does), before anything changes. A refusal by another buffer's writer says
        which buffer refused."""
        check = operator.methodcaller(f"check_{action}")
        check(self._writer)
        for other in self._readers.others(self):
            try:
                check(other.writer)
            except RuntimeError as err:
                raise RuntimeError(
                    f"another buffer reading this buffer's storage ({type(other).__name__} "
                    f"with a {type(other.writer).__name__}) refuses the {action}: {err}"
                ) from err

    @property
    def restored_together(self) -> tuple[Any, ...]:
        """The buffers whose states this buffer's restores (``load_state_dict``, ``loads``)
        and ``empty`` set along with its own: a ``ReplayBufferEnsemble``'s members. Their
        storages do not tell them of those resets (their new state comes with them), as a
        buffer's own storage does not tell the buffer; other buffers of those storages are
        told. A buffer alone has none.

        Examples
        --------
        >>> from tdreplay.core import ListStorage, ReplayBuffer
        >>> ReplayBuffer(storage=ListStorage(4)).restored_together
        ()
        """
        return ()

    def _replacing_rows_itself(self) -> AbstractContextManager[Any]:
        """What this buffer holds while it empties or restores its storage (the lock held):
        the storage, and those of :attr:`restored_together`, tell the other buffers reading
        them, not these."""
        replacing = contextlib.ExitStack()
        replacing.enter_context(self._readers.replaced_by(self))
        for member in self.restored_together:
            replacing.enter_context(member.storage.readers.replaced_by(member))
        return replacing

    def _tell_readers_emptied(self, empty_write_count: bool) -> None:
        """After this buffer's ``empty`` (the storage told the others: :meth:`_rows_replaced_past`):
        their writers forget their write count too when ``empty_write_count``, as this one's."""
        for other in self._readers.others(self):
            other.writer.empty(empty_write_count)

    #: whether the sampler was set onto the buffer as it was (``set_sampler``): it may know the
    #: slots of another storage, and learns this one's at the first slot it draws that the
    #: storage does not hold (see ``_sample``)
    _sampler_taken_as_is: bool = False

    def _rows_replaced_past(self, storage: Storage) -> None:
        """Every row of ``storage`` was replaced past this buffer, under its lock: emptied or
        restored directly (``rb.storage.empty()``, ``rb.storage.loads(path)``, as TorchRL
        programs do) or through another buffer of the storage. What knew the old rows follows
        at once, as after the buffer's own restore: the sampler learns the written slots anew,
        the writer follows (``Writer.rows_replaced``: a round-robin cursor goes on after the
        newest row, a max-value writer ranks the new rows),
        the batches drawn ahead and the items the write-side transforms hold back (a
        ``MultiStepTransform``'s steps) are dropped, and the rate limiter's counts start again
        from 0, as ``rb.empty()`` sets them."""
        if storage is not self._storage:  # (a storage this buffer has left)
            return
        self._sampler.learn_written_slots(storage)
        self._sampler_taken_as_is = False
        self._writer.rows_replaced(storage)
        self._forget_replaced_rows()

    def _forget_replaced_rows(self) -> None:
        """Drop the batches drawn ahead and the items the write-side transforms hold back, and
        count the rate limiter from 0: all of them were of rows a reset replaced."""
        self.clear_prefetch()
        self._transform.drop_held_items()
        if self._rate_limiter is not None:
            self._rate_limiter.reset()

    #: the ``restore_count`` of a storage that does not tell its readers of its resets
    #: (``Storage.tells_readers_of_resets`` false: a ``StorageEnsemble``) this buffer followed
    _restores_followed: int = 0

    def _follow_untold_resets(self) -> None:
        """Before a call through the gate, the prefetch queue or the write-side transforms:
        when the storage does not tell its readers of its resets (a ``StorageEnsemble``, whose
        members tell their own buffers) and was emptied or restored past this buffer since
        (a member's ``rb[0].empty()``), drop the batches drawn ahead and the items the
        transforms hold back, and count the rate limiter from 0, as a told buffer does at once.
        (The sampler follows such resets itself: ``SamplerEnsemble``.)"""
        storage = self._storage
        if storage.tells_readers_of_resets:
            return
        restores = storage.restore_count
        if restores != self._restores_followed:
            self._restores_followed = restores
            self._forget_replaced_rows()

    def _followed_own_reset(self) -> None:
        """After this buffer's own ``empty`` or restore: its parts are in step (a restored
        rate limiter keeps the counts it was given)."""
        self._restores_followed = self._storage.restore_count

    def _holds_a_readers_lock(self) -> bool:
        """Whether the calling thread is inside the lock of another buffer of the storage
        (``other.locked()``), which this buffer shares."""
        readers = self._readers
        return readers.shared and any(cast(ReplayBufferLock, other.locked()).held_here
                                      for other in readers.others(self))
