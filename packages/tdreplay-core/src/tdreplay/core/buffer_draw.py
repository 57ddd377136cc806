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
  (:func:`~tdreplay.core.transform_state.transform_mark`) and put back when a step raises
  (a later transform refusing the batch, ``attach_info``), the lock held the same way;
- other samplers and transforms have nothing to give back and pay nothing for it (the lock is
  released after the read, as always);
- random numbers drawn from the generator are not given back: with a seeded generator, the
  batches after a failed one differ from those a buffer that never failed would draw;
- a batch drawn ahead (``prefetch``) that fails is undone the same way, in the worker, and no
  job draws after it (:meth:`~tdreplay.core.prefetch.Prefetcher.halt`) until the error reaches
  the ``sample`` whose turn it was, which drops the queue: the next one draws afresh.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from .prefetch import Drawn, Prefetcher
from .sampler import Sampler
from .transform import Compose
from .transform_state import transform_mark, undo_transforms


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
            updates.wait()

    def _sample_undoably(self, batch_size: int, prefetch_epoch: int | None) -> Drawn | None:
        """``_sample`` from a sampler with :attr:`~Sampler.stateful_draws`, or through
        transforms with state: marked before the draw, the lock held until the batch is
        complete, the draw and the transforms' state put back if any step raises."""
        sampler = self._sampler
        with self._lock:
            mark = sampler.draw_mark() if sampler.stateful_draws else None
            transforms = transform_mark(self._transform)
            try:
                return self._sample(batch_size, prefetch_epoch, marked=True)
            except BaseException:
                if sampler.stateful_draws:
                    sampler.undo_draws(mark)
                undo_transforms(self._transform, transforms)
                raise

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
