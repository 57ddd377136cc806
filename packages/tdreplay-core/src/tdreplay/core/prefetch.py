"""Batches drawn ahead of time by a worker thread (a buffer's ``prefetch=N``)."""

from __future__ import annotations

import collections
import copy
import inspect
import threading
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from contextlib import contextmanager
from typing import Any

import torch
from tensordict import is_tensor_collection

from .fork_safety import ForkGuard, guard_forks

#: a sampled batch and its info (``index``, ``priority_weight``, ...)
Drawn = tuple[Any, dict[str, Any]]
#: ``draw(batch_size, epoch)``: a batch, or ``None`` when ``epoch`` is no longer current
DrawFn = Callable[[int, "int | None"], "Drawn | None"]


def held_weakly(fn: Callable[..., Any]) -> Callable[[], Callable[..., Any] | None]:
    """``fn`` behind a reference that does not keep its owner alive: calling the result gives
    ``fn``, or ``None`` once a bound method's object is gone. The prefetcher holds its buffer's
    methods so, or the queue and the buffer would keep each other alive until a gc pass.

    Examples
    --------
    >>> class Owner:
    ...     def clear(self):
    ...         return "cleared"
    >>> owner = Owner()
    >>> ref = held_weakly(owner.clear)
    >>> ref()()
    'cleared'
    >>> del owner
    >>> ref() is None
    True
    >>> held_weakly(len)()("abc")  # a plain function is held as is
    3
    """
    if inspect.ismethod(fn):
        return weakref.WeakMethod(fn)
    return lambda: fn


#: the job the prefetch worker thread runs now: its ``drew`` event (see :func:`note_drawn`)
_job = threading.local()


def _draw_if_alive(draw: Callable[[], DrawFn | None], batch_size: int, epoch: int,
                   drew: threading.Event) -> Drawn | None:
    """A queued job: nothing to draw once the buffer is gone."""
    fn = draw()
    _job.drew = drew
    try:
        return None if fn is None else fn(batch_size, epoch)
    finally:
        drew.set()  # (done, or dropped: nothing left to draw under the lock)
        _job.drew = None


def note_drawn() -> None:
    """Called by a batch drawn ahead once its draw under the buffer's lock is over (what is
    left, collating and transforming, runs without the lock): a thread holding the lock may
    then wait for it (:meth:`Prefetcher.held`). Nothing outside a prefetch job."""
    drew = getattr(_job, "drew", None)
    if drew is not None:
        drew.set()


#: how long saving a buffer waits for the batches being drawn ahead
SETTLE_TIMEOUT_S = 60.0


class PrefetchStateError(ValueError, RuntimeError):
    """A saved prefetch queue that this buffer cannot restore (another ``prefetch`` depth,
    a malformed state). A ``ValueError`` like tdreplay's other refused states, and a
    ``RuntimeError`` as TorchRL raises; the buffer is left unchanged."""


def detached_copy(value: Any) -> Any:
    """A copy of a drawn batch or its info that shares no memory with ``value``.

    Tensors are detached and cloned, keeping ``requires_grad`` (a batch computed with
    autograd is saved by value, not with its graph); TensorDicts, lists, tuples and dicts are
    copied entry by entry; anything else is deep-copied.

    Examples
    --------
    >>> x = torch.arange(3.0, requires_grad=True) * 2
    >>> y = detached_copy({"a": x})["a"]
    >>> y.is_leaf, y.requires_grad, y.tolist()
    (True, True, [0.0, 2.0, 4.0])
    """
    if isinstance(value, torch.Tensor):
        out = value.detach().clone()
        return out.requires_grad_() if value.requires_grad else out
    if is_tensor_collection(value):
        return value.apply(detached_copy)
    if isinstance(value, (list, tuple)):
        items = [detached_copy(v) for v in value]
        return type(value)(items) if type(value) in (list, tuple) else copy.deepcopy(value)
    if isinstance(value, dict):
        return {k: detached_copy(v) for k, v in value.items()}
    return copy.deepcopy(value)


class Prefetcher(ForkGuard):
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
        self._on_clear = None if on_clear is None else held_weakly(on_clear)
        self._queue: collections.deque[Future[Drawn | None]] = collections.deque()
        self._executor: ThreadPoolExecutor | None = None
        # serialises the samplers that share the queue; never held together with the buffer
        # lock by the thread that waits for a prefetched batch
        self._lock = threading.Lock()
        self._epoch = 0
        self._halted = False  # a batch drawn ahead failed: no job draws until clear()
        self._batch_size: int | None = None  # batch size of the queued batches
        #: each queued job's event, set once its draw under the buffer's lock is over
        self._drew: dict[Future[Drawn | None], threading.Event] = {}
        guard_forks(self)

    @property
    def epoch(self) -> int:
        """The current epoch: jobs queued in an earlier one must draw nothing (as must every
        job while :meth:`halt` holds: ``-1`` then, never a job's epoch)."""
        return -1 if self._halted else self._epoch

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
                self._clear_queue()
                self._batch_size = batch_size
            # top up to depth + 1, hand one out: exactly `depth` batches stay in flight
            while len(queue) < self.depth + 1:
                drew = threading.Event()
                future = self._executor.submit(_draw_if_alive, held_weakly(draw),
                                               batch_size, self._epoch, drew)
                self._drew[future] = drew
                queue.append(future)
            future = queue.popleft()
            self._drew.pop(future, None)
        # waited for without the queue's lock: the job takes the buffer's lock to draw, and a
        # thread holding that one (``rb.locked()``, then ``state_dict``) may need the queue's
        try:
            drawn = future.result()
            # a job dropped after it was handed out draws nothing: draw now instead
            fresh = drawn if drawn is not None else draw(batch_size, None)
        except BaseException:
            # the batches queued behind a failed one (e.g. sampled from an empty buffer)
            # would fail too, or be stale: drop them so the next sample starts afresh
            with self._lock:
                self._clear_queue()
            raise
        assert fresh is not None  # draw(..., None) always draws
        return fresh

    # ---- across a fork (tdreplay.core.fork_safety; the buffer's lock is held meanwhile) -------
    def settled(self, timeout: float) -> bool:
        """Whether, within ``timeout`` seconds, every queued job whose draw is over has ended
        (asked with the buffer's lock held: no job starts drawing meanwhile). Such a job must
        end before a fork, or the child would count its draw and never get its batch.

        Examples
        --------
        >>> Prefetcher(1).settled(timeout=0.0)
        True
        """
        drawing = [future for future, drew in list(self._drew.items()) if drew.is_set()]
        return not wait_futures(drawing, timeout=timeout).not_done

    def reset_in_child(self, held: bool) -> None:
        """In a forked child: the worker thread is gone, and so are the jobs it had not run
        (they drew nothing: :meth:`settled` held at the fork). The batches drawn stay queued."""
        self._lock = threading.Lock()  # (a thread of the parent may have held it)
        self._executor = None
        while self._queue and not self._queue[-1].done():
            self._drew.pop(self._queue.pop(), None)

    # ---- saving and restoring the queue (a buffer's state_dict / dumps / pickle) -------------
    @contextmanager
    def held(self, settle: bool, lock_held: bool = False) -> Iterator[None]:
        """Hold the queue still: no batch is handed out or queued meanwhile.

        With ``settle``, first wait until every queued batch is drawn (so the generator and
        the sampler have made every draw the queue holds). Take it *before* the buffer's
        lock: the jobs being waited for take that lock to draw. A caller that holds the
        buffer's lock already (``lock_held``) waits only for the jobs whose draw under the
        lock is over (they finish without it); the others have drawn nothing and cannot
        until the lock is let go, and :meth:`export` stops at the first of them.
        :meth:`export` and :meth:`restore` are called under it.
        """
        with self._lock:
            if settle and self._queue:
                waited = list(self._queue)
                if lock_held:
                    drawn = [self._drew.get(f) for f in waited]
                    waited = [f for f, drew in zip(waited, drawn, strict=True)
                              if drew is None or drew.is_set()]
                _, pending = wait_futures(waited, timeout=SETTLE_TIMEOUT_S)
                if pending:
                    raise RuntimeError(
                        f"{len(pending)} batches drawn ahead (prefetch) did not finish within "
                        f"{SETTLE_TIMEOUT_S:.0f} s: is the buffer's lock held by this thread?")
            yield

    def export(self) -> dict[str, Any]:
        """The queued batches, copied (:func:`detached_copy`), with the depth and batch size:
        what :meth:`restore` takes. Call under :meth:`held` with ``settle=True``.

        Examples
        --------
        >>> p = Prefetcher(1)
        >>> _ = p.next(2, lambda bs, epoch: ([0] * bs, {}))
        >>> with p.held(settle=True):
        ...     state = p.export()
        >>> state["capacity"], state["batch_size"], state["queue"]
        (1, 2, [([0, 0], {})])
        >>> p.shutdown()
        """
        queue = []
        for future in self._queue:
            if not future.done() or future.cancelled() or future.exception() is not None:
                break  # a failed draw: the restored buffer draws afresh from there
            drawn = future.result()
            if drawn is None:
                break
            queue.append(detached_copy(drawn))
        return {"version": 1, "capacity": self.depth, "batch_size": self._batch_size,
                "queue": queue}

    def check_state(self, state: Any, slots: int) -> None:
        """:class:`PrefetchStateError` unless :meth:`restore` can take ``state`` (``None``: no
        saved queue) into a buffer whose storage has ``slots`` slots (the saved batches'
        indices must name some, :meth:`check_indices`). Changes nothing."""
        if state is None:
            return
        if not isinstance(state, dict) or not isinstance(state.get("queue"), (list, tuple)):
            raise PrefetchStateError("the saved prefetch state must be a dict with a 'queue' "
                                     "list of batches drawn ahead.")
        queue, capacity = state["queue"], state.get("capacity")
        if not queue:
            return  # nothing was drawn ahead: any depth samples alike
        if capacity != self.depth:
            raise PrefetchStateError(
                f"Cannot restore a prefetch queue with capacity {capacity} into a replay "
                f"buffer with prefetch={self.depth}: its {len(queue)} batches drawn ahead "
                "would be handed out in another order than the saved buffer's.")
        if len(queue) > self.depth or not isinstance(state.get("batch_size"), int) or any(
                not isinstance(d, (tuple, list)) or len(d) != 2 for d in queue):
            raise PrefetchStateError(f"the saved prefetch queue holds {len(queue)} entries "
                                     f"for a depth of {self.depth}, or malformed entries.")
        self.check_indices(state, slots)

    @staticmethod
    def check_indices(state: Any, size: int) -> None:
        """:class:`PrefetchStateError` unless every tensor ``index`` in the info of the saved
        batches (a well-formed ``state``, see :meth:`check_state`) is an integer tensor inside
        ``[0, size)``, ``size`` being the storage's ``max_size``: an index outside it names
        no slot, and the restored buffer would hand it out with its batch (e.g. to
        ``update_priority``). Other indices (an ensemble's, none) are not checked.

        Examples
        --------
        >>> state = {"capacity": 1, "batch_size": 2,
        ...          "queue": [([0, 0], {"index": torch.tensor([3, 9])})]}
        >>> Prefetcher.check_indices(state, 10)
        >>> Prefetcher.check_indices(state, 8)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        tdreplay.core.prefetch.PrefetchStateError: the saved prefetch queue's batch 0 has ...
        """
        for i, (_, info) in enumerate(state["queue"] if state else ()):
            index = info.get("index") if isinstance(info, dict) else None
            if not isinstance(index, torch.Tensor):
                continue
            bad = index.is_floating_point() or index.is_complex() or index.dtype is torch.bool
            if not bad and index.numel():
                bad = bool(index.min() < 0) or bool(index.max() >= size)
            if bad:
                raise PrefetchStateError(
                    f"the saved prefetch queue's batch {i} has info['index'] "
                    f"{index.flatten()[:8].tolist()} ({index.dtype}), not slots in [0, {size}) "
                    "of this buffer's storage.")

    def restore(self, state: dict[str, Any] | None) -> None:
        """Replace the queue by the batches of ``state`` (from :meth:`export`, checked with
        :meth:`check_state`): the next batches handed out are those. ``None``: just clear."""
        self.clear()
        if not state or not state["queue"]:
            return
        for data, info in state["queue"]:
            future: Future[Drawn | None] = Future()
            future.set_result((detached_copy(data), detached_copy(info)))
            self._queue.append(future)
        self._batch_size = state["batch_size"]

    def halt(self) -> None:
        """Let no job draw (queued or queued later) until :meth:`clear`; the batches drawn
        already stay queued, handed out in turn.

        A buffer calls it under its lock when a batch being drawn ahead fails (its draw
        undone, :mod:`tdreplay.core.buffer_draw`): the error reaches the caller whose turn that
        batch is, who drops the queue (:meth:`clear`); meanwhile no job may draw, or a sampler
        whose draws change state would lose those draws with the queue.

        Examples
        --------
        >>> p = Prefetcher(1)
        >>> p.halt()
        >>> p.epoch  # the epoch of no job
        -1
        >>> p.clear()
        >>> p.epoch
        1
        """
        self._halted = True

    def _clear_queue(self) -> None:
        """Drop the queue through ``on_clear`` (while its owner lives), else :meth:`clear`."""
        on_clear = self._on_clear() if self._on_clear is not None else None
        (on_clear or self.clear)()

    def clear(self) -> None:
        """Drop the queued batches without waiting for them and start a new epoch.

        Never waits: a running job may be waiting for the buffer lock our caller holds.
        Ends a :meth:`halt`.
        """
        self._epoch += 1
        self._halted = False  # (after the new epoch: no job of an older one draws)
        while self._queue:
            try:
                future = self._queue.popleft()
            except IndexError:  # emptied by another thread meanwhile
                break
            future.cancel()
            self._drew.pop(future, None)

    def shutdown(self) -> None:
        """Stop the worker thread, cancelling the queued jobs."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
