"""``DrawAhead``: batches drawn by worker threads ahead of the caller (a client's prefetch)."""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

__all__ = ["DrawAhead"]


class DrawAhead:
    """Keeps ``depth`` calls of a draw in flight on ``depth`` threads (so their round trips
    overlap each other and the caller's work); :meth:`next` hands out the oldest.

    Examples
    --------
    >>> ahead = DrawAhead(2)
    >>> counter = iter(range(100))
    >>> [ahead.next("key", lambda: next(counter)) for _ in range(3)]
    [0, 1, 2]
    >>> ahead.queued
    2
    >>> ahead.clear(); ahead.queued
    0
    """

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self._queue: collections.deque[Future[Any]] = collections.deque()
        self._key: Hashable = None
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"depth": self.depth}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["depth"])  # type: ignore[misc]

    @property
    def queued(self) -> int:
        """Draws in flight or done, not handed out yet."""
        return len(self._queue)

    def next(self, key: Hashable, draw: Callable[[], Any]) -> Any:
        """The oldest draw of ``key`` (e.g. the batch size); the queue is topped up to
        ``depth`` more. Draws queued for another key are dropped; on an error, all are."""
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=max(self.depth, 1),
                                                    thread_name_prefix="tdreplay-draw-ahead")
            if key != self._key:
                self._queue.clear()
                self._key = key
            while len(self._queue) < self.depth + 1:
                self._queue.append(self._executor.submit(draw))
            future = self._queue.popleft()
        try:
            return future.result()
        except BaseException:
            self.clear()
            raise

    def clear(self) -> None:
        """Drop the draws queued (what they were drawn from changed)."""
        with self._lock:
            self._queue.clear()

    def close(self) -> None:
        """Drop the draws queued, wait for those running and stop the threads (a later
        :meth:`next` starts them again); what a buffer being closed does first, so that no
        draw runs against actors it kills.

        Examples
        --------
        >>> ahead = DrawAhead(2)
        >>> ahead.next("key", lambda: 1)
        1
        >>> ahead.close(); ahead.queued
        0
        """
        with self._lock:
            executor, self._executor = self._executor, None
            for future in self._queue:
                future.cancel()
            self._queue.clear()
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
