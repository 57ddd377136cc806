"""Batches drawn ahead of time by a worker thread (a buffer's ``prefetch=N``)."""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

#: a sampled batch and its info (``index``, ``priority_weight``, ...)
Drawn = tuple[Any, dict[str, Any]]
#: ``draw(batch_size, epoch)``: a batch, or ``None`` when ``epoch`` is no longer current
DrawFn = Callable[[int, "int | None"], "Drawn | None"]


class Prefetcher:
    """Keeps exactly ``depth`` batches in flight, drawn by one worker thread.

    Each job is tagged with the epoch it was queued in; :meth:`clear` drops the queued jobs
    and starts a new epoch, so a job that has not drawn yet returns without touching the
    sampler (or its generator): a buffer reset or restored samples as a fresh one would.

    Parameters
    ----------
    depth : int
        Batches kept drawn ahead (the buffer's ``prefetch``).
    on_clear : callable, optional
        What to call instead of :meth:`clear` when the queue must be dropped (a new batch
        size, a failed draw): the buffer's ``clear_prefetch``, which may clear more.

    Examples
    --------
    >>> def draw(batch_size, epoch):
    ...     return list(range(batch_size)), {}
    >>> p = Prefetcher(2)
    >>> p.next(3, draw)[0]  # one handed out, two more drawn ahead by the worker
    [0, 1, 2]
    >>> p.shutdown()
    """

    def __init__(self, depth: int, on_clear: Callable[[], None] | None = None) -> None:
        self.depth = depth
        self._on_clear = on_clear if on_clear is not None else self.clear
        self._queue: collections.deque[Future[Drawn | None]] = collections.deque()
        self._executor: ThreadPoolExecutor | None = None
        # serialises the samplers that share the queue; never held together with the buffer
        # lock by the thread that waits for a prefetched batch
        self._lock = threading.Lock()
        self._epoch = 0
        self._batch_size: int | None = None  # batch size of the queued batches

    @property
    def epoch(self) -> int:
        """The current epoch: jobs queued in an earlier one must draw nothing."""
        return self._epoch

    @property
    def queued(self) -> int:
        """Batches queued (drawn, or being drawn) ahead."""
        return len(self._queue)

    def next(self, batch_size: int, draw: DrawFn) -> Drawn:
        """The next batch of ``batch_size``; tops the queue up to ``depth`` batches ahead."""
        queue = self._queue
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1,
                                                    thread_name_prefix="tdreplay-prefetch")
            if batch_size != self._batch_size:
                # without a default batch_size, each size asked for: queued batches of another
                # size cannot be handed out
                self._on_clear()
                self._batch_size = batch_size
            # top up to depth + 1, hand one out: exactly `depth` batches stay in flight
            while len(queue) < self.depth + 1:
                queue.append(self._executor.submit(draw, batch_size, self._epoch))
            future = queue.popleft()
            try:
                drawn = future.result()
                # a job dropped after it was handed out draws nothing: draw now instead
                fresh = drawn if drawn is not None else draw(batch_size, None)
            except BaseException:
                # the batches queued behind a failed one (e.g. sampled from an empty buffer)
                # would fail too, or be stale: drop them so the next sample starts afresh
                self._on_clear()
                raise
            assert fresh is not None  # draw(..., None) always draws
            return fresh

    def clear(self) -> None:
        """Drop the queued batches without waiting for them and start a new epoch.

        Never waits: a running job may be waiting for the buffer lock our caller holds.
        """
        self._epoch += 1
        while self._queue:
            try:
                self._queue.popleft().cancel()
            except IndexError:  # emptied by another thread meanwhile
                break

    def shutdown(self) -> None:
        """Stop the worker thread, cancelling the queued jobs."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
