"""A buffer's rate limiter: the gates its ``sample`` and writes pass, and the limiter's counts
in the buffer's ``state_dict`` and ``dumps`` / ``loads``.

:class:`RateLimitedMixin` is one of the rooms :class:`~tdreplay.core.ReplayBuffer` is built
from (it extends :class:`~tdreplay.core.buffer_state.BufferStateMixin` with the limiter's
state). The gates are taken outside the buffer's lock: a sample waiting for data never keeps
a writer out, and a write waiting for samples never keeps a learner out.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from .buffer_state import BufferStateMixin
from .rate_limit import RateLimiter
from .utils import leading_dim

#: the gate of a buffer without a rate limiter: one shared no-op context (it keeps no state),
#: not a new one per ``extend`` and ``sample``
_NO_LIMIT: AbstractContextManager[Any] = nullcontext()


@contextmanager
def _behind(gate: AbstractContextManager[Any], lock: AbstractContextManager[Any]
            ) -> Iterator[None]:
    """``lock`` held once ``gate`` lets the call through (the gate first, as its waits must not
    hold the lock)."""
    with gate, lock:
        yield


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

    @property
    def rate_limiter(self) -> RateLimiter | None:
        """The buffer's :class:`~tdreplay.core.rate_limit.RateLimiter` (``None``: no limit)."""
        return self._rate_limiter

    def set_rate_limiter(self, rate_limiter: RateLimiter | None) -> None:
        """Use ``rate_limiter`` from now on (``None``: no limit)."""
        if rate_limiter is not None and not isinstance(rate_limiter, RateLimiter):
            raise TypeError(f"rate_limiter must be a RateLimiter (MinSize, SampleToInsertRatio)"
                            f" or None, got {type(rate_limiter).__name__}.")
        self._rate_limiter = rate_limiter

    def can_sample(self, batch_size: int) -> bool:
        """Whether the rate limiter allows sampling ``batch_size`` items now (no limiter:
        whether the buffer holds any)."""
        if self._rate_limiter is None:
            return len(self) > 0
        return self._rate_limiter.can_sample(batch_size, len(self))

    def _limit_samples(self, batch_size: int) -> AbstractContextManager[Any]:
        """The gate of a sample of ``batch_size`` (waits, counts; see the limiter)."""
        if self._rate_limiter is None:
            return _NO_LIMIT
        return self._rate_limiter.sampling(batch_size, self.__len__)

    def _write_lock(self, data: Any, single: bool = False) -> AbstractContextManager[Any]:
        """What a write of ``data`` (a batch, or one item with ``single``) holds: the buffer's
        lock, taken behind the limiter's gate when there is a limiter (without one, the lock
        itself: no gate to enter and leave on every write)."""
        if self._rate_limiter is None:
            return self._lock
        return _behind(self._rate_limiter.inserting(1 if single else leading_dim(data),
                                                    self.__len__), self._lock)

    # ---- the limiter's counts in the buffer's state --------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        out = super().state_dict()
        if self._rate_limiter is not None:
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
