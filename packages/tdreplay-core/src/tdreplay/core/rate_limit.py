"""Rate limiters: when a buffer may be sampled and when it may be written, as Reverb's.

A :class:`RateLimiter` counts the items inserted and the items sampled (a batch of ``n``
counts ``n``) and blocks a call that would break its rule until another thread's calls make it
allowed, or until ``timeout`` seconds passed (then :class:`RateLimitTimeout`, a
``TimeoutError``). With ``timeout=0`` nothing waits: a call not allowed now raises at once, and
:meth:`RateLimiter.can_sample` / :meth:`RateLimiter.can_insert` ask without calling.

Reverb's rule (``samples_per_insert`` ``s``, ``min_size_to_sample`` ``m``, ``min_diff`` /
``max_diff``): with ``diff = inserts * s - samples``,

- sampling ``n`` items needs ``size >= m`` and ``diff - n >= min_diff``;
- inserting ``k`` items is always allowed while ``size + k <= m``, else needs
  ``(inserts + k) * s - samples <= max_diff``.

:class:`MinSize` only waits for ``m`` items; :class:`SampleToInsertRatio` keeps the sampled /
inserted ratio near ``s`` within ``error_buffer``. The counts are the limiter's state: they
travel in a buffer's ``state_dict``, ``dumps`` / ``loads`` and pickles.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .checkpoint import CheckpointError, read_json, write_json
from .fork_safety import ForkGuard, guard_forks, left_locked, refusing_lock
from .process_sharing import SpawnChecked
from .utils import check_required_count, restore_attributes

__all__ = ["InsertDeferred", "MinSize", "RateLimitTimeout", "RateLimiter",
           "SampleToInsertRatio"]

SizeFn = Callable[[], int]


class RateLimitTimeout(TimeoutError):
    """A sample or insert the rate limiter did not allow within its timeout.

    ``operation`` is ``"sample"`` or ``"insert"``, ``timeout`` the seconds waited (``0.0``:
    non-blocking). Nothing was sampled or written.
    """

    def __init__(self, message: str, *, operation: str, timeout: float) -> None:
        super().__init__(message)
        self.operation = operation
        self.timeout = timeout

    def __reduce__(self) -> Any:  # keeps the keyword arguments across processes (Ray)
        return (_rebuild_timeout, (str(self), self.operation, self.timeout))


class InsertDeferred(Exception):  # noqa: N818 (a signal to retry, not an error a user sees)
    """An insert that a limiter does not allow now, raised instead of waiting inside
    :meth:`RateLimiter.deferring_inserts`; ``num_inserts``: its items. Nothing was counted."""

    def __init__(self, num_inserts: int) -> None:
        super().__init__(f"an insert of {num_inserts} items is not allowed now")
        self.num_inserts = num_inserts


def _rebuild_timeout(message: str, operation: str, timeout: float) -> RateLimitTimeout:
    return RateLimitTimeout(message, operation=operation, timeout=timeout)


def _check_timeout(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"timeout must be a number of seconds >= 0 (0: do not wait) or None "
                         f"(wait forever), got {value!r}.")
    return float(value)


class RateLimiter(SpawnChecked, ForkGuard):
    """Reverb's rate limiter: see the module docstring for the rule.

    Its counts live in this process's memory: a buffer holding one is not shareable
    (``share()``, a forked child's writes and a process being started refuse it with
    :class:`~tdreplay.core.NotShareableError`), since another process's inserts and samples
    would not count (a learner waiting for collectors in other processes waited for good).

    Parameters
    ----------
    samples_per_insert : float
        ``s``: how many item samples one inserted item is worth.
    min_size_to_sample : int
        ``m``: sampling waits until the buffer holds this many items.
    min_diff, max_diff : float
        Bounds of ``inserts * s - samples`` (sampling keeps it ``>= min_diff``, inserting
        ``<= max_diff``).
    timeout : float or None
        Seconds a call waits before :class:`RateLimitTimeout` (``None``: forever; ``0``: no
        wait, raise at once).

    Examples
    --------
    >>> limiter = RateLimiter(samples_per_insert=2.0, min_size_to_sample=1, min_diff=0.0,
    ...                       max_diff=10.0, timeout=0)
    >>> limiter.can_sample(1, size=0), limiter.can_insert(3, size=0)
    (False, True)
    """

    shareable = False
    not_shareable_message = (
        "Cannot share a buffer with a rate limiter ({cls}) between processes: its insert and "
        "sample counts live in this process's memory, so the other processes' writes and "
        "samples would not count. Give each process its own rate-limited buffer, or use a "
        "RayReplayBuffer, whose actor counts every process's calls.")

    def __init__(self, *, samples_per_insert: float, min_size_to_sample: int,
                 min_diff: float, max_diff: float, timeout: float | None = None) -> None:
        min_size_to_sample = check_required_count(min_size_to_sample, "min_size_to_sample", 1)
        if not float(samples_per_insert) > 0:
            raise ValueError(f"samples_per_insert must be > 0, got {samples_per_insert!r}.")
        if not float(min_diff) <= float(max_diff):
            raise ValueError(f"min_diff ({min_diff}) must be <= max_diff ({max_diff}).")
        self.samples_per_insert = float(samples_per_insert)
        self.min_size_to_sample = min_size_to_sample
        self.min_diff = float(min_diff)
        self.max_diff = float(max_diff)
        self.timeout = _check_timeout(timeout)
        self._inserts = 0
        self._samples = 0
        #: inserts let through whose writes have not succeeded yet (see :meth:`inserting`)
        self._pending_inserts = 0
        #: how many times the counts were set (reset, restored): a sample counted before
        #: leaves them as they are when it fails or draws fewer (see :meth:`sampling`)
        self._counts_set = 0
        self._cond = threading.Condition()
        self._local = threading.local()
        guard_forks(self)

    # ---- pickling: the counts travel, the lock does not ---------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_cond"], state["_local"]
        state["_pending_inserts"] = 0  # (the writes in flight are this process's)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        restore_attributes(self, state)
        if "_pending_inserts" not in state:  # (pickled before it counted them)
            self._pending_inserts = 0
        if "_counts_set" not in state:  # (pickled by a release before 0.6.6)
            self._counts_set = 0
        self._cond = threading.Condition()
        self._local = threading.local()
        guard_forks(self)

    # ---- across a fork (tdreplay.core.fork_safety) -------------------------------------------
    def hold(self, timeout: float | None = None) -> bool:
        return bool(self._cond.acquire(timeout=timeout or 0))  # (0: without waiting)

    def release(self) -> None:
        self._cond.release()

    def reset_in_child(self, held: bool) -> None:
        """The threads waiting for the rule, and the inserts they were letting through, are
        the parent's: the child counts only what it inserts and samples."""
        left = not held and left_locked(self._cond)
        self._cond = threading.Condition(refusing_lock("This rate limiter") if left else None)
        self._local = threading.local()
        self._pending_inserts = 0

    # ---- the rule ----------------------------------------------------------------------------
    @property
    def inserts(self) -> int:
        """Items inserted so far (counted when their write succeeds; see :meth:`inserting`)."""
        return self._inserts

    @property
    def samples(self) -> int:
        """Items sampled so far (a batch of ``n`` counts ``n``)."""
        return self._samples

    def can_sample(self, num_samples: int, size: int) -> bool:
        """Whether sampling ``num_samples`` items from a buffer of ``size`` items is allowed now."""
        if size < self.min_size_to_sample:
            return False
        diff = self._inserts * self.samples_per_insert - self._samples - num_samples
        return diff >= self.min_diff

    def can_insert(self, num_inserts: int, size: int) -> bool:
        """Whether inserting ``num_inserts`` items into a buffer of ``size`` is allowed now
        (no item, e.g. an empty ``extend``, always is: it inserts nothing)."""
        if num_inserts <= 0 or size + num_inserts <= self.min_size_to_sample:
            return True
        inserts = self._inserts + self._pending_inserts + num_inserts  # (writes in flight too)
        diff = inserts * self.samples_per_insert - self._samples
        return diff <= self.max_diff

    # ---- gates around a buffer's calls -------------------------------------------------------
    @contextmanager
    def call_timeout(self, timeout: float | None) -> Iterator[None]:
        """Within the block, this thread's calls wait at most ``timeout`` s, and never longer
        than the limiter's own ``timeout`` (``None``: no further cap); used by a buffer served
        to remote callers, whose calls have their own deadline."""
        with self._thread_setting("timeout", _check_timeout(timeout)):
            yield

    @contextmanager
    def refusing_waits(self, reason: str) -> Iterator[None]:
        """Within the block, a call of this thread that the limiter does not allow now raises
        ``RuntimeError(reason)`` at once instead of waiting: what a buffer does for a call
        made while its thread holds the buffer's lock (``rb.locked()``), where no other
        thread's write or sample could ever let it through.

        Examples
        --------
        >>> limiter = MinSize(4)
        >>> with limiter.refusing_waits("no"), limiter.sampling(2, size=lambda: 1):
        ...     pass  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        RuntimeError: no
        """
        with self._thread_setting("refuse", reason):
            yield

    @contextmanager
    def deferring_inserts(self) -> Iterator[None]:
        """Within the block, an insert of this thread that the limiter does not allow now
        raises :class:`InsertDeferred` at once instead of waiting: what a buffer does for a
        write through transforms with state, which runs whole under the buffer's lock (so that
        a checkpoint sees the transforms' state and the storage of one moment) and waits with
        :meth:`wait_for_insert` after putting the transforms back and releasing the lock.

        Examples
        --------
        >>> limiter = SampleToInsertRatio(1.0, 1, (0.0, 2.0), timeout=0)
        >>> with limiter.inserting(2, size=lambda: 0) as written:
        ...     written()
        >>> try:
        ...     with limiter.deferring_inserts(), limiter.inserting(1, size=lambda: 2):
        ...         pass
        ... except InsertDeferred as deferred:
        ...     print(deferred.num_inserts, limiter.inserts)
        1 2
        """
        with self._thread_setting("deferring", True):
            yield

    def wait_for_insert(self, num_inserts: int, size: SizeFn,
                        started: float | None = None) -> None:
        """Wait until inserting ``num_inserts`` items is allowed, counting nothing (the
        insert itself still passes :meth:`inserting`); the timeout runs from ``started`` (a
        ``time.monotonic()`` reading; now by default), so that retries of one write share it.
        :class:`RateLimitTimeout` when not allowed in time.

        Examples
        --------
        >>> MinSize(1, timeout=0).wait_for_insert(5, size=lambda: 0)
        """
        with self._once_allowed("insert", lambda size: self.can_insert(num_inserts, size), size,
                                f"inserting {num_inserts} items", started):
            pass

    @contextmanager
    def _thread_setting(self, name: str, value: Any) -> Iterator[None]:
        """This thread's setting ``name`` (read by the gates: ``timeout``, ``refuse``,
        ``deferring``) is ``value`` within the block, then what it was."""
        previous = getattr(self._local, name, None)
        setattr(self._local, name, value)
        try:
            yield
        finally:
            setattr(self._local, name, previous)

    def _timeout(self) -> float | None:
        cap: float | None = getattr(self._local, "timeout", None)
        if cap is None or self.timeout is None:
            return self.timeout if cap is None else cap
        return min(cap, self.timeout)

    @contextmanager
    def _once_allowed(self, operation: str, allowed: Callable[[int], bool], size: SizeFn,
                      what: str, started: float | None = None,
                      deferred: BaseException | None = None) -> Iterator[None]:
        """Hold ``_cond`` once ``allowed(size())``; :class:`RateLimitTimeout` if not in time
        (counted from ``started``, a ``time.monotonic()`` reading; now by default), and at
        once ``deferred`` (when given) or this thread's refusal (:meth:`refusing_waits`) where
        it would wait. ``size()`` is read without ``_cond``: it may take the buffer's lock,
        which a writer holds when it counts its items (:meth:`inserting`)."""
        timeout = self._timeout()
        started = time.monotonic() if started is None else started
        deadline = None if timeout is None else started + timeout
        refuse = getattr(self._local, "refuse", None)
        while True:
            current = size()
            with self._cond:
                if allowed(current):
                    yield
                    return
                if deferred is not None:
                    raise deferred
                if refuse is not None:
                    raise RuntimeError(refuse)
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    how = "(non-blocking: timeout=0)" if not timeout else f"within {timeout} s"
                    raise RateLimitTimeout(
                        f"the rate limiter did not allow {what} {how}: inserts={self._inserts}, "
                        f"samples={self._samples}, {self!r}. Nothing was done; retry later, or "
                        "let the other side (collectors or learners) catch up.",
                        operation=operation, timeout=float(timeout or 0.0))
                # wake now and then: the buffer's size may change without a notification (empty)
                self._cond.wait(0.5 if remaining is None else min(remaining, 0.5))

    @contextmanager
    def sampling(self, num_samples: int, size: SizeFn) -> Iterator[Callable[[int], None]]:
        """Wait until sampling ``num_samples`` items is allowed (``size()``: the buffer's
        length), count them, run the block; uncounted again if the block raises. A block that
        drew fewer items (the last batch of an epoch) says how many by calling the function
        it gets with their number: only those stay counted.

        Raises ``ValueError`` when the batch can never be allowed (larger than
        ``max_diff - min_diff``), :class:`RateLimitTimeout` when not allowed in time.

        Examples
        --------
        >>> limiter = MinSize(2, timeout=0)
        >>> with limiter.sampling(5, size=lambda: 2):
        ...     pass
        >>> limiter.samples
        5
        >>> with limiter.sampling(4, size=lambda: 2) as drew:
        ...     drew(1)
        >>> limiter.samples
        6
        """
        if num_samples > self.max_diff - self.min_diff:
            raise ValueError(
                f"a batch of {num_samples} is never allowed by {self!r}: the difference "
                f"max_diff - min_diff ({self.max_diff - self.min_diff}) must be at least the "
                "batch size (widen error_buffer, or sample smaller batches).")
        with self._once_allowed("sample", lambda size: self.can_sample(num_samples, size),
                                size, f"sampling {num_samples} items"):
            self._samples += num_samples
            self._cond.notify_all()  # inserts waiting for samples may go on
            # counts set after this (a reset, a restore) hold none of its items: a failed or
            # shorter draw then leaves them as they are
            counts_set = self._counts_set
        counted = num_samples

        def drew(count: int) -> None:
            nonlocal counted
            with self._cond:
                if self._counts_set == counts_set:
                    self._samples -= counted - count
                counted = count
                self._cond.notify_all()

        try:
            yield drew
        except BaseException:
            with self._cond:
                if self._counts_set == counts_set:
                    self._samples -= counted
                self._cond.notify_all()
            raise

    def _lowest_diff(self) -> float:
        """The lowest ``inserts * samples_per_insert - samples`` this limiter can reach: samples
        bring it down to ``min_diff``, a reset to 0, and restored counts may hold it lower."""
        with self._cond:
            now = self._inserts * self.samples_per_insert - self._samples
        return min(0.0, self.min_diff, now)

    @contextmanager
    def inserting(self, num_inserts: int, size: SizeFn) -> Iterator[Callable[[], None]]:
        """Wait until inserting ``num_inserts`` items is allowed, then run the block (the
        write); ``ValueError`` when the insert can never be allowed (more items than the
        limiter lets in between two samples, past ``min_size_to_sample``). The items count as
        inserted once the write succeeded: when the block calls
        the function it gets (a buffer calls it under its lock, so that a state saved at any
        moment holds the items and their count together), else when the block ends. Until
        then they are held for the write (other inserts see them, samples do not); a block
        that raises before counting them gives them back. Samplers waiting are woken after.

        Examples
        --------
        >>> limiter = MinSize(1, timeout=0)
        >>> with limiter.inserting(3, size=lambda: 0) as written:
        ...     before = limiter.inserts
        ...     written()
        >>> before, limiter.inserts
        (0, 3)
        """
        if num_inserts > self.min_size_to_sample \
                and num_inserts * self.samples_per_insert > self.max_diff - self._lowest_diff():
            raise ValueError(
                f"an insert of {num_inserts} items is never allowed by {self!r}: "
                f"{num_inserts} * samples_per_insert exceeds the most max_diff allows from the "
                "lowest difference samples reach (insert smaller batches, or widen max_diff - "
                "min_diff: SampleToInsertRatio's error_buffer). Nothing was written.")
        # (deferring_inserts: the caller waits, without its lock)
        deferred = InsertDeferred(num_inserts) if getattr(self._local, "deferring", False) \
            else None
        with self._once_allowed("insert", lambda size: self.can_insert(num_inserts, size), size,
                                f"inserting {num_inserts} items", deferred=deferred):
            self._pending_inserts += num_inserts
        counted = False

        def written() -> None:
            nonlocal counted
            with self._cond:
                if not counted:
                    counted = True
                    self._pending_inserts -= num_inserts
                    self._inserts += num_inserts
                    self._cond.notify_all()  # samplers waiting for data may go on

        try:
            yield written
        except BaseException:
            with self._cond:
                if not counted:  # (once counted, the items were written: they stay counted)
                    self._pending_inserts -= num_inserts
                self._cond.notify_all()
            raise
        written()

    # ---- state -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The counts (``inserts``, ``samples``) and the class, for a buffer's state."""
        with self._cond:
            return {"class": type(self).__name__, "inserts": self._inserts,
                    "samples": self._samples}

    def check_state_dict(self, state_dict: Any) -> None:
        """``ValueError`` unless ``state_dict`` is a :meth:`state_dict` of this class."""
        if not isinstance(state_dict, dict) or state_dict.get("class") != type(self).__name__:
            raise ValueError(f"not a state of a {type(self).__name__}: {state_dict!r}.")
        for key in ("inserts", "samples"):
            value = state_dict.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"rate limiter state {key!r} must be an int >= 0, got "
                                 f"{value!r}.")

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the counts (checked first)."""
        self.check_state_dict(state_dict)
        with self._cond:
            self._inserts = int(state_dict["inserts"])
            self._samples = int(state_dict["samples"])
            self._counts_set += 1
            self._cond.notify_all()

    def dumps(self, path: str | Path) -> None:
        """Write the counts into directory ``path`` (a buffer's ``dumps`` calls it)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        write_json(path / "rate_limiter.json", self.state_dict())

    def prepare_load(self, path: str | Path) -> Callable[[], None]:
        """Read and check the counts under ``path``; returns what installs them."""
        file = Path(path) / "rate_limiter.json"
        state = read_json(file)
        try:
            self.check_state_dict(state)
        except ValueError as err:
            raise CheckpointError(f"{str(file)!r}: {err}") from err
        return lambda: self.load_state_dict(state)

    def reset(self) -> None:
        """Set both counts to 0 (a buffer's ``empty`` calls it); writes under way keep their
        place and count when they succeed."""
        self.load_state_dict({"class": type(self).__name__, "inserts": 0, "samples": 0})

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(samples_per_insert={self.samples_per_insert}, "
                f"min_size_to_sample={self.min_size_to_sample}, min_diff={self.min_diff}, "
                f"max_diff={self.max_diff}, timeout={self.timeout})")


class MinSize(RateLimiter):
    """Sampling waits until the buffer holds ``min_size_to_sample`` items; nothing else.

    Examples
    --------
    >>> from tdreplay.core import ReplayBuffer
    >>> rb = ReplayBuffer(rate_limiter=MinSize(3, timeout=0), batch_size=2)
    >>> _ = rb.extend([1, 2])
    >>> rb.sample()  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    tdreplay.core.rate_limit.RateLimitTimeout: the rate limiter did not allow sampling 2 ...
    >>> _ = rb.add(3)
    >>> len(rb.sample())
    2
    """

    def __init__(self, min_size_to_sample: int, *, timeout: float | None = None) -> None:
        super().__init__(samples_per_insert=1.0, min_size_to_sample=min_size_to_sample,
                         min_diff=-math.inf, max_diff=math.inf, timeout=timeout)

    def __repr__(self) -> str:
        return f"MinSize(min_size_to_sample={self.min_size_to_sample}, timeout={self.timeout})"


class SampleToInsertRatio(RateLimiter):
    """Keep ``samples / inserts`` near ``samples_per_insert`` (Reverb's ``SampleToInsertRatio``).

    ``error_buffer``: a number ``e`` gives ``min_diff, max_diff = s * m -+ e`` around the
    offset ``s * m`` (``m = min_size_to_sample``); a pair gives them directly. It must span at
    least ``2 * max(1, samples_per_insert)``, else calls could block each other for good; a
    sample of ``n`` items needs it to span ``n`` too (a larger batch raises ``ValueError``).
    Samplers that run ahead wait for inserts, inserters that run ahead wait for samples.

    Examples
    --------
    >>> from tdreplay.core import ReplayBuffer
    >>> rb = ReplayBuffer(rate_limiter=SampleToInsertRatio(2.0, 4, 8.0, timeout=0))
    >>> _ = rb.extend(list(range(8)))  # diff = 16 = 2 * 4 + 8: inserts must wait now
    >>> rb.extend([9])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    tdreplay.core.rate_limit.RateLimitTimeout: the rate limiter did not allow inserting 1 items ...
    >>> _ = rb.sample(8)  # samples bring diff back to 8
    >>> _ = rb.extend([9])
    """

    def __init__(self, samples_per_insert: float, min_size_to_sample: int,
                 error_buffer: float | tuple[float, float], *,
                 timeout: float | None = None) -> None:
        if isinstance(error_buffer, (int, float)) and not isinstance(error_buffer, bool):
            offset = float(samples_per_insert) * min_size_to_sample
            min_diff, max_diff = offset - error_buffer, offset + error_buffer
        elif isinstance(error_buffer, (tuple, list)) and len(error_buffer) == 2:
            min_diff, max_diff = float(error_buffer[0]), float(error_buffer[1])
        else:
            raise TypeError(f"error_buffer must be a number or a (min_diff, max_diff) pair, got "
                            f"{error_buffer!r}.")
        if not float(samples_per_insert) > 0:
            raise ValueError(f"samples_per_insert must be > 0, got {samples_per_insert!r}.")
        if max_diff - min_diff < 2 * max(1.0, float(samples_per_insert)):
            raise ValueError(
                f"error_buffer must span at least 2 * max(1, samples_per_insert) = "
                f"{2 * max(1.0, float(samples_per_insert))} (got min_diff={min_diff}, "
                f"max_diff={max_diff}): a smaller one could block samples and inserts for good.")
        super().__init__(samples_per_insert=samples_per_insert,
                         min_size_to_sample=min_size_to_sample, min_diff=min_diff,
                         max_diff=max_diff, timeout=timeout)
