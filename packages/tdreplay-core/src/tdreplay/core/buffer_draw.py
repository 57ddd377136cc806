"""A ``sample`` is one step: it hands out a batch, or it raises and changes nothing.

:class:`DrawMixin` is one of the rooms :class:`~tdreplay.core.ReplayBuffer` is built from.
A sample draws from the sampler under the buffer's lock and reads the items, then collates
them, finishes the batch, attaches the sampler's info and runs the read-side transforms
(:mod:`tdreplay.core.buffer_read_path`). Any of these steps may raise (a transform or a
``collate_fn`` refusing the batch, a storage failing to read it); the caller then gets no
batch, and the buffer is left as it was:

- a sampler whose draws change state (:attr:`~tdreplay.core.Sampler.stateful_draws`: samplers
  without replacement, consuming samplers, an ensemble holding one) is marked before the draw
  (:meth:`~tdreplay.core.Sampler.draw_mark`) and put back
  (:meth:`~tdreplay.core.Sampler.undo_draws`) when a step raises. The buffer holds its lock
  from the draw to the finished batch, so no other draw or write comes in between and the
  undo is exact: the epoch's items are drawn again, nothing is consumed;
- read-side transforms with state (:attr:`~tdreplay.core.Transform.has_state`, e.g.
  ``VecNorm``'s running statistics) are copied before the draw
  (:meth:`DrawMixin.mark_read_state`) and put back when a step raises (a later transform
  refusing the batch, ``attach_info``), the lock held the same way; a buffer with more
  read-side state (an ensemble's member transforms) extends :attr:`DrawMixin.has_read_state`
  and the mark and undo;
- other samplers and transforms have nothing to give back and pay nothing for it (the lock is
  released after the read, as always);
- random numbers drawn from the generator are not given back: with a seeded generator, the
  batches after a failed one differ from those a buffer that never failed would draw;
- a batch drawn ahead (``prefetch``) that fails is undone the same way, in the worker, and no
  job draws after it (:meth:`~tdreplay.core.prefetch.Prefetcher.halt`) until the error reaches
  the ``sample`` whose turn it was, which drops the queue: the next one draws afresh.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import TYPE_CHECKING, Any, cast

from .prefetch import Drawn, Prefetcher
from .sampler import Sampler
from .transform import Compose
from .transform_state import transform_mark, undo_transforms

if TYPE_CHECKING:
    from .replay_buffer import ReplayBuffer

__all__ = ["reads_undone_on_failure"]


class DrawMixin:
    """Drawing a batch as one step (mixed into :class:`~tdreplay.core.ReplayBuffer`)."""

    _sampler: Sampler
    _transform: Compose
    _lock: AbstractContextManager[Any]
    _prefetcher: Prefetcher
    #: the queue of updates ``submit_update_if_present`` submitted (an ``UpdateQueue``, made
    #: at the first submission): a draw waits for those submitted before it, and sees them
    _submitted_updates: Any = None

    if TYPE_CHECKING:  # what the buffer this is mixed into provides
        def _sample(self, batch_size: int, prefetch_epoch: int | None = None,
                    marked: bool = False) -> Drawn | None: ...

        def holds_lock(self) -> bool: ...

    def _draw(self, batch_size: int) -> Drawn:
        """Sample a batch now (no prefetch queue), once the updates submitted are done."""
        if self._submitted_updates is not None:  # (checked here: no call on the hot path)
            self._await_submitted_updates()
        drawn = self._sample(batch_size)
        assert drawn is not None  # only a dropped prefetch job draws nothing
        return drawn

    def _await_submitted_updates(self) -> None:
        """Wait for the updates submitted so far (without the buffer's lock, which they take):
        what a draw or a restore does first."""
        updates = self._submitted_updates
        if updates is not None:
            if updates.unfinished and self.holds_lock():
                raise RuntimeError(
                    f"{updates.unfinished} updates submitted with submit_update_if_present "
                    "are not done yet, and they need the buffer's lock, which this thread "
                    "holds (inside rb.locked()): sample or save after the locked() block, or "
                    "call rb.synchronize() before entering it.")
            updates.wait()

    @property
    def has_read_state(self) -> bool:
        """Whether a read (``sample``) changes state outside the sampler that a failed read
        must put back: read-side transforms with state (``VecNorm``'s statistics).

        A buffer holding more such state (an ensemble: its members' transforms, which run
        inside its ``collate_fn``) extends this property, :meth:`mark_read_state` and
        :meth:`undo_read_state` together.

        Examples
        --------
        >>> from tdreplay.core import ReplayBuffer
        >>> ReplayBuffer().has_read_state, ReplayBuffer(transform=lambda x: x).has_read_state
        (False, False)
        """
        return bool(self._transform.transforms) and self._transform.has_state

    def mark_read_state(self) -> Any:
        """A copy of the state a read changes outside the sampler (see
        :attr:`has_read_state`), taken under the buffer's lock before a draw, for
        :meth:`undo_read_state` to put back if the read fails; ``None`` when there is none.

        Examples
        --------
        >>> from tdreplay.core import ReplayBuffer
        >>> rb = ReplayBuffer()
        >>> mark = rb.mark_read_state()
        >>> rb.undo_read_state(mark)  # nothing to put back: no transform with state
        >>> mark is None
        True
        """
        return transform_mark(self._transform)

    def undo_read_state(self, mark: Any) -> None:
        """Put back the state :meth:`mark_read_state` copied (nothing for ``None``)."""
        undo_transforms(self._transform, mark)

    def _sample_undoably(self, batch_size: int, prefetch_epoch: int | None) -> Drawn | None:
        """``_sample`` from a sampler with :attr:`~Sampler.stateful_draws`, or through
        transforms with state: marked before the draw, the lock held until the batch is
        complete, the draw and the transforms' state put back if any step raises."""
        with reads_undone_on_failure(cast("ReplayBuffer", self)):
            return self._sample(batch_size, prefetch_epoch, marked=True)

    def _sample_ahead(self, batch_size: int, prefetch_epoch: int | None) -> Drawn | None:
        """``_sample`` for the prefetch queue (:meth:`Prefetcher.next`): a batch drawn ahead
        (``prefetch_epoch`` set) that fails lets no job draw until the error reaches the
        ``sample`` whose turn it was (:meth:`~tdreplay.core.prefetch.Prefetcher.halt`), with
        any sampler: the generator and the sampler stay where the failure left them. Waits
        first for the updates submitted (the update worker never waits for a prefetch job:
        no cycle)."""
        self._await_submitted_updates()
        try:
            return self._sample(batch_size, prefetch_epoch)
        except BaseException:
            if prefetch_epoch is not None:
                self._prefetcher.halt()
            raise


@contextmanager
def reads_undone_on_failure(*buffers: ReplayBuffer) -> Iterator[None]:
    """Make several reads of ``buffers`` one step: their locks are held (in the order given)
    and the state their draws change is marked (samplers with
    :attr:`~tdreplay.core.Sampler.stateful_draws`, :attr:`~DrawMixin.has_read_state`); if the
    body raises, every buffer is put back as it was before it, then the error goes on.

    What code composing buffers uses to make a batch out of several draws (an
    offline-to-online buffer: an offline draw, then an online one), so that a later draw or
    step refusing the batch leaves nothing consumed in an earlier one. Batches a buffer drew
    ahead (``prefetch``) are taken from its queue as usual and are not given back.

    Examples
    --------
    >>> from tdreplay.core import ListStorage, ReplayBuffer, SamplerWithoutReplacement
    >>> first = ReplayBuffer(storage=ListStorage(4), sampler=SamplerWithoutReplacement())
    >>> second = ReplayBuffer(storage=ListStorage(4))
    >>> _ = first.extend([0, 1, 2, 3])
    >>> try:
    ...     with reads_undone_on_failure(first, second):
    ...         part = first.sample(4)   # the whole epoch of ``first``...
    ...         second.sample(1)         # ...then ``second`` (empty) refuses
    ... except RuntimeError:
    ...     pass
    >>> sorted(first.sample(4))          # the epoch was given back: all four rows again
    [0, 1, 2, 3]
    """
    with ExitStack() as locks:
        marks = []
        for buffer in buffers:
            locks.enter_context(buffer.locked())
            sampler = buffer.sampler
            marks.append((buffer, sampler.draw_mark() if sampler.stateful_draws else None,
                          buffer.mark_read_state() if buffer.has_read_state else None))
        try:
            yield
        except BaseException:
            for buffer, draws, read_state in reversed(marks):
                if draws is not None:
                    buffer.sampler.undo_draws(draws)
                if read_state is not None:
                    buffer.undo_read_state(read_state)
            raise
