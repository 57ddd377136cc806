"""Iterating a buffer: ``for batch in rb`` and TorchRL's ``rb.next()``.

:class:`IterationMixin` (mixed into :class:`~tdreplay.core.ReplayBuffer`): endless batches of
``batch_size`` with a sampler drawing with replacement; one epoch with a finite one
(``SamplerWithoutReplacement``), ending with the batch with which the sampler ran out. Every
batch goes through the rate limiter's gate, as ``sample`` does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from .prefetch import Drawn
from .sampler import Sampler

__all__ = ["IterationMixin", "NextBatchMixin"]


class IterationMixin:
    """``__iter__`` and ``next`` of :class:`~tdreplay.core.ReplayBuffer`."""

    _batch_size: int | None
    _sampler: Sampler

    if TYPE_CHECKING:  # what the buffer this is mixed into provides
        def sample(self, batch_size: int | None = None, return_info: bool = False) -> Any: ...
        def _sampler_is_finite(self) -> bool: ...
        def _limited_draw(self, batch_size: int, draw: Callable[[int], Drawn]) -> Drawn: ...
        def _draw(self, batch_size: int) -> Drawn: ...

    def __iter__(self) -> Iterator[Any]:
        """Yield batches of ``batch_size``; ends after one epoch with a finite sampler."""
        batch_size = self._batch_size
        if batch_size is None:
            raise RuntimeError("Cannot iterate over the replay buffer. Batch_size was not "
                               "specified (build the buffer with batch_size=... to iterate).")
        if not self._sampler_is_finite():
            while True:
                yield self.sample()
        while True:  # (through the rate limiter's gate, as sample)
            data, _ = self._limited_draw(batch_size, self._draw)
            yield data
            if self._sampler.ran_out:
                return


class NextBatchMixin:
    """TorchRL's ``next()`` over a buffer's iteration (``iter(self)``): mixed into
    :class:`~tdreplay.core.ReplayBuffer`, and public for buffers served elsewhere (a Ray
    actor's client) whose ``__iter__`` differs. The iteration is kept in
    ``_next_batches``, which a subclass leaves out of its pickled state."""

    _next_batches: Iterator[Any] | None = None  # the iteration next() goes through

    if TYPE_CHECKING:  # what the buffer this is mixed into provides
        def __iter__(self) -> Iterator[Any]: ...

    def next(self) -> Any:
        """The next batch of an iteration over the buffer (``iter(rb)``) kept between calls,
        or ``None`` once it ends (after one epoch of a finite sampler); the call after that
        starts a new epoch. TorchRL's ``next``, for code that cannot write a ``for`` loop over
        the buffer (a remote one). The iteration is this object's: a copy (pickle) starts its
        own.

        Examples
        --------
        >>> from tdreplay.core import ListStorage, ReplayBuffer, SamplerWithoutReplacement
        >>> rb = ReplayBuffer(storage=ListStorage(4), sampler=SamplerWithoutReplacement(),
        ...                   batch_size=2)
        >>> _ = rb.extend([10, 11, 12, 13])
        >>> first, second = rb.next(), rb.next()
        >>> sorted(first + second), rb.next()
        ([10, 11, 12, 13], None)
        >>> len(rb.next())  # a new epoch
        2
        """
        batches = self._next_batches
        if batches is None:
            batches = self._next_batches = iter(self)
        try:
            return next(batches)
        except StopIteration:
            self._next_batches = None
            return None
        except BaseException:  # (a generator that raised is done: the next call starts anew)
            self._next_batches = None
            raise
