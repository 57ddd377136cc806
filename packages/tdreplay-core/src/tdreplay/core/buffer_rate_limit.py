"""A buffer's rate limiter: the gates its ``sample`` and writes pass, and the limiter's counts
in the buffer's ``state_dict`` and ``dumps`` / ``loads``.

:class:`RateLimitedMixin` is one of the rooms :class:`~tdreplay.core.ReplayBuffer` is built
from (it extends :class:`~tdreplay.core.buffer_state.BufferStateMixin` with the limiter's
state). The gates are taken outside the buffer's lock: a sample waiting for data never keeps
a writer out, and a write waiting for samples never keeps a learner out.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

import torch
from tensordict import is_tensor_collection

from .buffer_state import BufferStateMixin
from .rate_limit import InsertDeferred, RateLimiter
from .utils import leading_dim


def _uncounted(count: int) -> None:
    """What a sample's gate without a limiter is told of the items drawn: nothing to count."""


#: the gate of a buffer without a rate limiter: one shared no-op context (it keeps no state),
#: not a new one per ``extend`` and ``sample``
_NO_LIMIT: AbstractContextManager[Any] = nullcontext(_uncounted)


@contextmanager
def _behind(gate: AbstractContextManager[Callable[[], None]],
            lock: AbstractContextManager[Any]) -> Iterator[None]:
    """``lock`` held once ``gate`` (a limiter's :meth:`~RateLimiter.inserting`) lets the write
    through (the gate first, as its waits must not hold the lock); the items are counted
    before the lock is released, so that a state saved under the lock holds both or
    neither."""
    with gate as written, lock:
        yield
        written()


_SAMPLE_IN_LOCKED = (
    "sample() inside rb.locked(): the rate limiter does not allow this sample now, and no "
    "write can let it through while this thread holds the buffer's lock (writes wait for "
    "it). Nothing was drawn: sample outside locked(), or ask rb.can_sample() first.")
_WRITE_IN_LOCKED = (
    "a write inside rb.locked(): the rate limiter does not allow it until more samples are "
    "drawn, which wait for the buffer's lock this thread holds. Nothing was written: write "
    "outside locked().")


@contextmanager
def _refusing_waits(limiter: RateLimiter, gate: AbstractContextManager[Any],
                    reason: str) -> Iterator[Any]:
    """``gate`` (a limiter's), raising ``RuntimeError(reason)`` where it would wait."""
    with limiter.refusing_waits(reason), gate as passed:
        yield passed


class BelowMinSize(Exception):  # noqa: N818 (a signal to go back to the gate, never a user's)
    """Raised by a draw (under the buffer's lock) that finds the buffer below the limiter's
    ``min_size_to_sample``: emptied (or consumed) after the gate let the sample through. The
    sample goes back to the gate (:meth:`RateLimitedMixin._limited_draw`)."""


def drawn_items(index: Any, requested: int) -> int:
    """The number of items a batch drawn for ``requested`` holds, from its ``index``: fewer
    at the end of a finite sampler's epoch, told by a flat ``[n]`` index of ``n`` slots; any
    other index (coordinates, an ensemble's ``[buffers, n]``) counts as ``requested``.

    Examples
    --------
    >>> drawn_items(torch.tensor([4, 7]), 3), drawn_items(torch.zeros(2, 3), 6)
    (2, 6)
    """
    if isinstance(index, torch.Tensor) and index.ndim == 1:
        return min(int(index.shape[0]), requested)
    return requested


class RateLimitedMixin(BufferStateMixin):
    """The rate limiter of a replay buffer (mixed into :class:`ReplayBuffer`).

    Examples
    --------
    >>> from tdreplay.core import ReplayBuffer
    >>> from tdreplay.core.rate_limit import MinSize
    >>> rb = ReplayBuffer(rate_limiter=MinSize(2, timeout=0))
    >>> rb.can_sample(1)
    False
    >>> _ = rb.extend([1, 2])
    >>> rb.can_sample(1), rb.rate_limiter.inserts
    (True, 2)
    >>> rb.state_dict()["_rate_limiter"]
    {'class': 'MinSize', 'inserts': 2, 'samples': 0}
    """

    _rate_limiter: RateLimiter | None = None

    if TYPE_CHECKING:  # what the buffer this is mixed into provides (buffer_readers)
        def _follow_untold_resets(self) -> None: ...

    @property
    def rate_limiter(self) -> RateLimiter | None:
        """The buffer's :class:`~tdreplay.core.rate_limit.RateLimiter` (``None``: no limit)."""
        return self._rate_limiter

    def set_rate_limiter(self, rate_limiter: RateLimiter | None) -> None:
        """Use ``rate_limiter`` from now on (``None``: no limit)."""
        if rate_limiter is not None and not isinstance(rate_limiter, RateLimiter):
            raise TypeError(f"rate_limiter must be a RateLimiter (MinSize, SampleToInsertRatio)"
                            f" or None, got {type(rate_limiter).__name__}.")
        if rate_limiter is not None and getattr(self, "shared", False):
            rate_limiter.check_shareable()  # (a shared buffer: its counts would stay here)
        self._rate_limiter = rate_limiter

    def can_sample(self, batch_size: int | None = None) -> bool:
        """Whether a sample of ``batch_size`` (the buffer's by default) can be drawn now: the
        sampler can draw it (:meth:`~tdreplay.core.Sampler.can_sample`, as TorchRL's) and the
        rate limiter, if any, allows it. ``RuntimeError`` without a batch size."""
        if batch_size is None:
            batch_size = self._batch_size
            if batch_size is None:
                raise RuntimeError("batch_size not specified. Configure it on the replay buffer "
                                   "or pass it to can_sample().")
        with self._lock:
            if not self._sampler.can_sample(self._storage, batch_size):
                return False
        if self._rate_limiter is None:
            return True
        return self._rate_limiter.can_sample(batch_size, len(self))

    def _limit_samples(self, batch_size: int) -> AbstractContextManager[Any]:
        """The gate of a sample of ``batch_size`` (waits, counts; see the limiter)."""
        limiter = self._rate_limiter
        if limiter is None:
            return _NO_LIMIT
        self._follow_untold_resets()
        if limiter.min_size_to_sample > self._storage.max_size:  # (it would wait for good)
            raise ValueError(
                f"a sample is never allowed by {limiter!r}: min_size_to_sample="
                f"{limiter.min_size_to_sample} is more than the storage can hold (max_size="
                f"{self._storage.max_size}). Use a larger storage or a smaller "
                "min_size_to_sample.")
        gate = limiter.sampling(batch_size, self.__len__)
        if self.holds_lock():  # (rb.locked(): no write could let a wait through)
            return _refusing_waits(limiter, gate, _SAMPLE_IN_LOCKED)
        return gate

    def _limited_draw(self, batch_size: int, draw: Callable[[int], Any]) -> Any:
        """``draw(batch_size)`` (a ``(batch, info)`` pair) behind the limiter's sample gate,
        counted as the items it drew; a draw that finds the buffer below
        ``min_size_to_sample`` (:class:`BelowMinSize`: emptied or consumed since the gate let
        it through) goes back to the gate, uncounted."""
        while True:
            try:
                with self._limit_samples(batch_size) as drew:
                    drawn = draw(batch_size)
                    drew(drawn_items(drawn[1].get("index"), batch_size))
                    return drawn
            except BelowMinSize:
                continue

    def _check_min_size(self) -> None:
        """:class:`BelowMinSize` when the buffer holds fewer items than the limiter's
        ``min_size_to_sample``; called by a draw under the buffer's lock."""
        limiter = self._rate_limiter
        if limiter is not None and self.__len__() < limiter.min_size_to_sample:
            raise BelowMinSize

    def _write_lock(self, data: Any, single: bool = False) -> AbstractContextManager[Any]:
        """What a write of ``data`` (a batch, or one item with ``single``) holds: the buffer's
        lock, taken behind the limiter's gate when there is a limiter (without one, the lock
        itself: no gate to enter and leave on every write)."""
        limiter = self._rate_limiter
        if limiter is None:
            return self._lock
        self._follow_untold_resets()
        gate = limiter.inserting(self._items_in(data, single), self.__len__)
        if self.holds_lock():  # (rb.locked(): no sample could let a wait through)
            gate = _refusing_waits(limiter, gate, _WRITE_IN_LOCKED)
        return _behind(gate, self._lock)

    def _write_whole_under_lock(self, write: Callable[[], Any]) -> Any:
        """Run ``write`` (a write through transforms with state, which takes the buffer's lock
        before the transforms run and puts their state back if it raises) with the limiter's
        gate passed under that lock: where the gate would wait, the write is undone and the
        lock released for the wait, then the write runs again from the transforms on. A
        checkpoint or an ``empty()`` made meanwhile thus never sees transforms that hold a
        waiting write's items, and concurrent writes through them run one at a time. The
        limiter's timeout counts from the first try."""
        limiter = self._rate_limiter
        if limiter is None or self.holds_lock():  # (rb.locked(): a gate that would wait raises)
            return write()
        started = time.monotonic()
        while True:
            try:
                with limiter.deferring_inserts():
                    return write()
            except InsertDeferred as deferred:
                limiter.wait_for_insert(deferred.num_inserts, self.__len__, started)

    def _items_in(self, data: Any, single: bool) -> int:
        """The items a write of ``data`` adds (the limiter counts items, as ``len`` does): a
        batch's leading dim, or one item; in a storage of ``ndim`` dims, each row of a batch
        (each item written) holds the items of its first ``ndim - 1`` batch dims."""
        lead = 1 if single else leading_dim(data)
        inner = self._storage.ndim - 1
        if inner <= 0:
            return lead
        shape = data.batch_size if is_tensor_collection(data) else getattr(data, "shape", None)
        start = 0 if single else 1
        if shape is None or len(shape) < start + inner:
            return lead
        return lead * int(math.prod(shape[start:start + inner]))

    # ---- the limiter's counts in the buffer's state --------------------------------------------
    def _state_under_lock(self) -> dict[str, Any]:
        out = super()._state_under_lock()
        if self._rate_limiter is not None:  # (read with the storage: writes count under it)
            out["_rate_limiter"] = self._rate_limiter.state_dict()
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        limiter = self._rate_limiter
        saved = state_dict.get("_rate_limiter") if isinstance(state_dict, dict) else None
        if limiter is not None and saved is not None:
            try:
                limiter.check_state_dict(saved)
            except ValueError as err:
                raise ValueError(f"state_dict['_rate_limiter']: {err}") from err
        super().load_state_dict(state_dict)
        if limiter is not None and saved is not None:
            limiter.load_state_dict(saved)

    def _components(self) -> dict[str, Any]:
        parts = super()._components()
        if self._rate_limiter is not None:
            parts["rate_limiter"] = self._rate_limiter
        return parts
