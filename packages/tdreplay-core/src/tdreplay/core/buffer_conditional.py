"""Conditional updates of stored rows: ``rb.update_if_present`` and its asynchronous form
``rb.submit_update_if_present`` (as TorchRL's).

:class:`ConditionalUpdateMixin` is one of the rooms :class:`~tdreplay.core.ReplayBuffer` is
built from. Round-robin writers recycle rows, so an index captured at sampling time may point
at another record by the time an asynchronous computation writes back; ``update_if_present``
patches only the rows whose write generation (:mod:`tdreplay.core.generations`) is still the
one captured with the index, and leaves the others untouched.

``submit_update_if_present`` checks its arguments now and hands the update to the buffer's
:class:`UpdateQueue`: one worker thread, started at the first submission, runs the updates in
submission order under the buffer's lock. A batch drawn after a submission (by ``sample``, or
ahead by a ``prefetch`` job) waits for it; ``synchronize`` waits for all of them and
``shutdown`` stops the worker. The queue is no part of the buffer's state: a pickled or
deep-copied buffer gets an empty one, and ``state_dict`` / ``dumps`` save the storage as it is
(call ``synchronize`` first to include the updates still pending).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from tensordict import TensorClass, TensorDictBase, is_tensor_collection, unravel_key

from .fork_safety import ForkGuard, guard_forks
from .sampler import Sampler
from .service_backends import ServiceBackendMixin
from .storage import Storage
from .utils import as_long_tensor, check_flag, patch_entries
from .writer import Writer

__all__ = ["UPDATE_WAIT_TIMEOUT_S", "ConditionalUpdateMixin", "ConditionalUpdateResult",
           "UpdateQueue"]

#: how long a sample, ``synchronize`` or ``shutdown`` waits for the submitted updates
UPDATE_WAIT_TIMEOUT_S = 60.0


class ConditionalUpdateResult(TensorClass["nocast"]):  # type: ignore[type-arg,name-defined]
    """What :meth:`ConditionalUpdateMixin.update_if_present` did, record by record.

    ``updated``: bool tensor in the order of the indices passed, True where the record was
    live and got the patch. ``version_rejected``: with ``version_key`` only (else ``None``),
    True where the record was live but lost the version comparison. Every record is in exactly
    one of updated / version_rejected / stale.

    A tensorclass, as TorchRL's: its batch size is the records' (``updated.shape`` unless
    given), so ``len(result)``, ``result[i]`` and ``result.to(device)`` work as on a
    TensorDict.

    Examples
    --------
    >>> result = ConditionalUpdateResult(torch.tensor([True, False, True]))
    >>> len(result), result.updated_count, result.stale_count, result[1].updated.item()
    (3, 2, 1, False)
    """

    updated: torch.Tensor
    version_rejected: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if not self.batch_size and self.updated.ndim:  # (no batch size given: the records')
            self.batch_size = self.updated.shape

    @property
    def updated_count(self) -> int:
        """Records that were live and patched."""
        return int(self.updated.sum())

    @property
    def version_rejected_count(self) -> int:
        """Records that were live but lost the version comparison."""
        return 0 if self.version_rejected is None else int(self.version_rejected.sum())

    @property
    def stale_count(self) -> int:
        """Records whose row was rewritten or emptied since the handle was taken."""
        return self.updated.numel() - self.updated_count - self.version_rejected_count


def _as_patch(patch: Any) -> dict[Any, torch.Tensor]:
    """``patch`` (a mapping or TensorDict of tensors) as ``{unravelled key: tensor}``."""
    out = {}
    for key, value in patch_entries(patch):
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"patch[{key!r}] must be a tensor, got {type(value).__name__}.")
        out[unravel_key(key)] = value
    return out


def _check_patch(patch: dict[Any, torch.Tensor], probe: TensorDictBase,
                 slots_shape: torch.Size) -> dict[Any, torch.Tensor]:
    """Check every entry against the stored leaf (``probe``: one stored item, batch [1]);
    return the entries reshaped to ``[records, *feature]``. ``KeyError`` for a key the
    storage lacks, ``ValueError`` for a shape or dtype that does not fit; nothing written."""
    records = slots_shape.numel()
    out = {}
    for key, value in patch.items():
        leaf = probe.get(key, None)
        if leaf is None or not isinstance(leaf, torch.Tensor):
            raise KeyError(f"patch key {key!r} is not an entry of the stored data (keys: "
                           f"{sorted(str(k) for k in probe.keys(True, True))}).")
        feature = leaf.shape[1:]
        if value.shape != slots_shape + feature:
            raise ValueError(f"patch[{key!r}] has shape {tuple(value.shape)}; the index "
                             f"addresses {tuple(slots_shape)} records of entry shape "
                             f"{tuple(feature)}, so it must be {tuple(slots_shape + feature)}.")
        if value.dtype != leaf.dtype:
            raise ValueError(f"patch[{key!r}] has dtype {value.dtype}; the stored entry is "
                             f"{leaf.dtype}.")
        out[key] = value.reshape((records, *feature))
    return out


def _version_entry(version_key: Any, version: Any, patch: dict[Any, torch.Tensor],
                   probe: TensorDictBase, records: int) -> tuple[Any, torch.Tensor]:
    """The checked version key and one incoming version per record (``ValueError`` /
    ``KeyError`` naming the argument)."""
    if isinstance(version_key, str) and "." in version_key:
        raise ValueError(f"Dotted-string version keys are not supported: got version_key "
                         f"{version_key!r}; pass the nested key as a tuple, e.g. "
                         f"{tuple(version_key.split('.'))!r}.")
    key = unravel_key(version_key)
    if key in patch:
        raise ValueError(f"version_key {key!r} may not appear in patch: it is written with "
                         "the accepted version.")
    leaf = probe.get(key, None)
    if leaf is None or not isinstance(leaf, torch.Tensor):
        raise KeyError(f"version_key {key!r} is not an entry of the stored data.")
    if any(d != 1 for d in leaf.shape[1:]):
        raise ValueError(f"version_key {key!r} must name a per-record scalar entry; the "
                         f"storage holds entry shape {tuple(leaf.shape[1:])}.")
    if isinstance(version, torch.Tensor):
        incoming = version
    else:
        try:
            incoming = torch.as_tensor(version, dtype=leaf.dtype)
        except (TypeError, ValueError, RuntimeError) as err:
            raise TypeError(f"version must be a number, a sequence of numbers or a tensor, "
                            f"got {type(version).__name__} ({version!r}).") from err
    if incoming.dtype != leaf.dtype:
        raise ValueError(f"version has dtype {incoming.dtype}; the stored {key!r} is "
                         f"{leaf.dtype}.")
    while incoming.ndim > 1 and incoming.shape[-1] == 1:
        incoming = incoming.squeeze(-1)
    if incoming.ndim == 0:
        incoming = incoming.expand(records)
    elif incoming.ndim != 1 or incoming.numel() != records:
        raise ValueError(f"version must be a scalar or hold one entry per record, got shape "
                         f"{tuple(torch.as_tensor(version).shape)} for {records} records.")
    return key, incoming.reshape(records)


def _keep_best_per_slot(slots: torch.Tensor, incoming: torch.Tensor) -> torch.Tensor:
    """Mask of the rows that carry the highest incoming version of their slot (the last such
    row on ties): one write per slot, whatever the input order."""
    uniq, ids = torch.unique(slots, return_inverse=True)
    if uniq.numel() == ids.numel():
        return torch.ones_like(slots, dtype=torch.bool)
    best = torch.full((uniq.numel(),), 0, dtype=incoming.dtype)
    best = best.scatter_reduce(0, ids, incoming, "amax", include_self=False)
    is_max = incoming == best[ids]
    row = torch.arange(ids.numel())
    last = torch.full((uniq.numel(),), -1, dtype=torch.long)
    last = last.scatter_reduce(0, ids, torch.where(is_max, row, -1), "amax")
    return row == last[ids]


@dataclass(frozen=True)
class _UpdateRequest:
    """The arguments of one conditional update, checked as far as they can be without the
    stored data (:meth:`ConditionalUpdateMixin._request`)."""

    slots: torch.Tensor  # as given (its shape is the patch's leading shape)
    flat: torch.Tensor  # the slots, flat, on the CPU
    captured: torch.Tensor  # one generation per record, on the CPU
    entries: dict[Any, torch.Tensor]
    version_key: Any
    version: Any
    require_newer: bool


class UpdateQueue(ForkGuard):
    """The updates handed to a buffer's ``submit_update_if_present``, run one at a time in
    submission order by one worker thread (``tdreplay-update``), started at the first one.

    :meth:`wait` waits for those submitted so far; :meth:`close` refuses new ones and stops the
    worker once they are done. A copy (pickle, ``copy.deepcopy``) is a new, empty queue: the
    worker and its pending updates stay with the original.

    Examples
    --------
    >>> queue = UpdateQueue()
    >>> queue.submit(lambda: 2 + 2).result()
    4
    >>> queue.close()
    >>> queue.submit(lambda: 1)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    RuntimeError: A shut down replay buffer cannot accept updates ...
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._pending: list[Future[Any]] = []  # running or queued, and failed ones not yet seen
        self._closed = False
        guard_forks(self)

    def __reduce__(self) -> tuple[type[UpdateQueue], tuple[()]]:
        return UpdateQueue, ()

    def submit(self, job: Callable[[], Any]) -> Future[Any]:
        """Queue ``job``; its future. ``RuntimeError`` once :meth:`close` was called."""
        with self._lock:
            if self._closed:
                raise RuntimeError("A shut down replay buffer cannot accept updates "
                                   "(submit_update_if_present after shutdown()).")
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1,
                                                    thread_name_prefix="tdreplay-update")
            # keep the failures for wait(raise_errors=True); forget the updates that went well
            self._pending = [f for f in self._pending if not f.done() or f.exception()]
            future = self._executor.submit(job)
            self._pending.append(future)
        return future

    @property
    def unfinished(self) -> int:
        """How many submitted updates are queued or running."""
        with self._lock:
            return sum(not future.done() for future in self._pending)

    def wait(self, timeout: float | None = UPDATE_WAIT_TIMEOUT_S, *,
             raise_errors: bool = False) -> None:
        """Wait until every update submitted so far is done. ``RuntimeError`` after
        ``timeout`` seconds. With ``raise_errors``, the first failure among them (and those
        that failed since the last such call) is raised, and they are forgotten."""
        check_flag(raise_errors, "raise_errors")
        with self._lock:
            pending = list(self._pending)
        _, not_done = wait_futures(pending, timeout=timeout)
        if not_done:
            raise RuntimeError(
                f"{len(not_done)} submitted conditional updates did not finish within "
                f"{timeout} s: is the buffer's lock held by this thread?")
        if not raise_errors:
            return
        with self._lock:
            self._pending = [f for f in self._pending if f not in pending]
        errors = [f.exception() for f in pending if not f.cancelled() and f.exception()]
        if errors:
            raise errors[0]  # type: ignore[misc]

    # ---- across a fork (tdreplay.core.fork_safety) -----------------------------------------
    def reset_in_child(self, held: bool) -> None:
        """In a forked child: the worker thread is gone; the updates it had not applied are
        the parent's (the child's buffer is as it was at the fork), the failures are kept."""
        self._lock = threading.Lock()  # (a thread of the parent may have held it)
        self._executor = None
        self._pending = [future for future in self._pending if future.done()]

    def close(self, timeout: float | None = None) -> None:
        """Refuse new updates, wait for the submitted ones (at most ``timeout`` seconds; the
        others still run) and let the worker thread end."""
        with self._lock:
            self._closed = True
            executor, self._executor = self._executor, None
            pending = list(self._pending)
        wait_futures(pending, timeout=timeout)
        if executor is not None:
            executor.shutdown(wait=False)


T = TypeVar("T")
_QUEUE_CREATION = threading.Lock()


class ConditionalUpdateMixin(ServiceBackendMixin):
    """``update_if_present``, ``submit_update_if_present`` and ``synchronize`` (mixed into
    :class:`~tdreplay.core.ReplayBuffer`; before :class:`ServiceBackendMixin` there, whose
    ``shutdown`` it extends to wait for the submitted updates). Draws wait for them too
    (:class:`~tdreplay.core.buffer_draw.DrawMixin` reads the queue, ``_submitted_updates``)."""

    _storage: Storage
    _sampler: Sampler
    _writer: Writer
    _lock: AbstractContextManager[Any]
    _submitted_updates: UpdateQueue | None  # (made by the first submission: submit_update)

    if TYPE_CHECKING:  # what the buffer this is mixed into provides (buffer_readers)
        def _tell_readers_edited(self, keys: list[Any] | None) -> None: ...

    def update_if_present(self, *, index: Any, generation: Any, patch: Any,
                          version_key: Any = None, version: Any = None,
                          require_newer: bool = False) -> ConditionalUpdateResult:
        """Patch the stored records that still hold what ``(index, generation)`` saw.

        ``index``: slots, as ``extend`` returns them or a sample carries under ``"index"``;
        ``generation``: their write generations, as a sample carries under
        ``"index_generation"`` (or ``rb.writer.generations_of(index)``); ``patch``: a mapping
        (or TensorDict) of entries to overwrite, each shaped ``index.shape + entry shape``.
        A record whose row was rewritten or emptied since is skipped and never modified; a
        patched record keeps its generation (the handle keeps working).

        With ``version_key`` and ``version`` (a scalar, or one per record), a live record is
        patched only when ``version >= stored`` (``> stored`` with ``require_newer``), and the
        accepted version is written into ``version_key`` with the patch; of several handles on
        one slot only the one with the highest version applies.

        The whole patch is checked before anything is written (``KeyError`` for a key the
        storage lacks, ``ValueError`` for a shape or dtype that does not fit or a bad
        version). Needs a storage of TensorDicts (``Storage.supports_conditional_update``) and
        a writer built with ``track_generations=True``; ``RuntimeError`` otherwise. Runs
        under the buffer's lock.

        Examples
        --------
        >>> from tensordict import TensorDict
        >>> from tdreplay.core import RoundRobinWriter, TensorDictReplayBuffer
        >>> from tdreplay.storages import LazyTensorStorage
        >>> rb = TensorDictReplayBuffer(storage=LazyTensorStorage(4),
        ...                             writer=RoundRobinWriter(track_generations=True))
        >>> index = rb.extend(TensorDict({"x": torch.zeros(4)}, [4]))
        >>> handle = rb.writer.generations_of(index)
        >>> _ = rb.extend(TensorDict({"x": -torch.ones(1)}, [1]))
        >>> result = rb.update_if_present(index=index, generation=handle,
        ...                               patch={"x": torch.full((4,), 7.0)})
        >>> result.updated.tolist(), result.stale_count
        ([False, True, True, True], 1)
        >>> rb[:]["x"].tolist()  # row 0 was rewritten: left as it is
        [-1.0, 7.0, 7.0, 7.0]
        """
        request = self._request(index, generation, patch, version_key, version, require_newer)
        return self._apply(request)

    def submit_update_if_present(self, *, index: Any, generation: Any, patch: Any,
                                 version_key: Any = None, version: Any = None,
                                 require_newer: bool = False
                                 ) -> Future[ConditionalUpdateResult]:
        """:meth:`update_if_present` on a background thread: a future of its result.

        The arguments are those of :meth:`update_if_present`, checked now against the stored
        data: a bad one raises here (as :meth:`update_if_present` would), and nothing is
        queued. The updates then run one at a time, in submission order, each under the
        buffer's lock, on a worker thread the buffer starts at its first submission. A batch
        drawn after this call returns (by :meth:`sample`, or ahead by a ``prefetch`` job)
        waits for the update and sees it; batches drawn ahead before it are handed out as they
        were drawn. An update that fails at run time (e.g. the storage was replaced by one
        without the patched entry) changes nothing and raises from ``future.result()``.

        ``index``, ``generation``, ``patch`` and ``version`` are kept by reference until the
        future is done: do not change them in between (clone values held in buffers that are
        reused, e.g. CUDA-graph outputs). Values on another device than the storage are copied
        by the worker thread.

        :meth:`synchronize` waits for every submitted update (e.g. before ``state_dict`` or
        ``dumps``, which save the storage as it is); :meth:`shutdown` waits for them, stops the
        worker and refuses later submissions (``RuntimeError``). A copy of the buffer (pickle,
        ``copy.deepcopy``) has no pending updates and starts its own worker when needed.

        Examples
        --------
        >>> from tensordict import TensorDict
        >>> from tdreplay.core import RoundRobinWriter, TensorDictReplayBuffer
        >>> from tdreplay.storages import LazyTensorStorage
        >>> rb = TensorDictReplayBuffer(storage=LazyTensorStorage(4),
        ...                             writer=RoundRobinWriter(track_generations=True))
        >>> index = rb.extend(TensorDict({"value": torch.zeros(4)}, [4]))
        >>> generation = rb.writer.generations_of(index)
        >>> future = rb.submit_update_if_present(index=index, generation=generation,
        ...                                      patch={"value": torch.ones(4)})
        >>> future.result().updated_count
        4
        >>> rb[:]["value"].tolist()
        [1.0, 1.0, 1.0, 1.0]
        >>> rb.submit_update_if_present(index=index, generation=generation,
        ...                             patch={"missing": torch.ones(4)})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        KeyError: "patch key 'missing' is not an entry of the stored data ...
        >>> rb.shutdown()
        """
        request = self._request(index, generation, patch, version_key, version, require_newer)
        if not self.is_alive:
            raise RuntimeError("A shut down replay buffer cannot accept updates "
                               "(submit_update_if_present after shutdown()).")
        with self._lock:
            probe = self._probe()
            if probe is not None:
                self._checked_values(request, probe)
        return self.submit_update(functools.partial(self._apply, request))

    def synchronize(self) -> None:
        """Wait for every update submitted with :meth:`submit_update_if_present` so far, and
        raise the first that failed since the last call (as TorchRL's ``synchronize``).
        ``RuntimeError`` if they are not done within :data:`UPDATE_WAIT_TIMEOUT_S` seconds
        (e.g. called while this thread holds the buffer's lock, which they need)."""
        queue = self._submitted_updates
        if queue is not None:
            queue.wait(raise_errors=True)

    def shutdown(self, timeout: float | None = None) -> None:
        """Wait for the submitted updates (at most ``timeout`` seconds), stop the update
        worker, then shut the buffer down (:meth:`ServiceBackendMixin.shutdown`)."""
        with _QUEUE_CREATION:  # a closed queue even if nothing was submitted: refuses later ones
            queue = self._submitted_updates
            if queue is None:
                queue = self._submitted_updates = UpdateQueue()
        queue.close(timeout)
        super().shutdown(timeout)

    def submit_update(self, update: Callable[[], T]) -> Future[T]:
        """Run ``update()`` on the buffer's update worker, after every update submitted before
        it; its future (extension API: what :meth:`submit_update_if_present` queues once its
        arguments are checked, for a buffer that routes conditional updates itself, e.g. an
        ensemble). Draws, restores and :meth:`synchronize` wait for it as for the others;
        ``RuntimeError`` after :meth:`shutdown`.

        Examples
        --------
        >>> from tdreplay.core import ReplayBuffer
        >>> rb = ReplayBuffer()
        >>> rb.submit_update(lambda: 1 + 1).result()
        2
        >>> rb.shutdown()
        """
        if not self.is_alive:  # (a copy of a shut down buffer has a fresh queue)
            raise RuntimeError("A shut down replay buffer cannot accept updates "
                               "(submit_update after shutdown()).")
        queue = self._submitted_updates
        if queue is None:
            with _QUEUE_CREATION:  # two first submissions: one queue, one order
                queue = self._submitted_updates
                if queue is None:  # (an attribute, never through __dict__: see buffer_parts)
                    queue = self._submitted_updates = UpdateQueue()
        return queue.submit(update)

    # ---- checking and applying an update ------------------------------------------------------
    def _request(self, index: Any, generation: Any, patch: Any, version_key: Any, version: Any,
                 require_newer: bool) -> _UpdateRequest:
        """The arguments checked as far as they can be without the stored data."""
        storage, writer = self._storage, self._writer
        if not storage.supports_conditional_update or not writer.tracks_generations:
            lacking = [] if storage.supports_conditional_update else [
                f"the storage must hold TensorDicts in columns (e.g. LazyTensorStorage; "
                f"{type(storage).__name__} does not)"]
            if not writer.tracks_generations:
                lacking.append(f"the writer must track generations (e.g. "
                               f"TensorDictRoundRobinWriter(track_generations=True); this "
                               f"{type(writer).__name__} does not)")
            raise RuntimeError(
                f"conditional updates are not supported by {type(storage).__name__} with "
                f"{type(writer).__name__}: {' and '.join(lacking)}.")
        check_flag(require_newer, "require_newer")
        if isinstance(index, tuple):
            index = index[0]
        # (integers only: a float index or generation would be truncated onto another handle)
        slots = as_long_tensor(index, name="index")
        captured = as_long_tensor(generation, name="generation").reshape(-1).cpu()
        if captured.numel() != slots.numel():
            raise ValueError(f"index and generation must address the same records, got "
                             f"{slots.numel()} indices and {captured.numel()} generations.")
        if (version_key is None) != (version is None):
            raise ValueError("version_key and version must be passed together.")
        return _UpdateRequest(slots, slots.reshape(-1).cpu(), captured, _as_patch(patch),
                              version_key, version, require_newer)

    def _probe(self) -> TensorDictBase | None:
        """What a patch is checked against (lock held): one stored item (batch ``[1]``), or
        an emptied storage's layout (batch ``[0]``); ``None`` for a storage never written
        (nothing to check against: no record can be live). ``RuntimeError`` for a storage
        that does not hold TensorDicts."""
        storage = self._storage
        if len(storage):
            probe: TensorDictBase = storage.get(torch.zeros(1, dtype=torch.long))
        elif storage.initialized:
            probe = storage.get(torch.zeros(0, dtype=torch.long))
        else:
            return None
        if not is_tensor_collection(probe):
            raise RuntimeError(f"conditional updates need a storage of TensorDicts; "
                               f"{type(storage).__name__} holds {type(probe).__name__}.")
        return probe

    @staticmethod
    def _checked_values(request: _UpdateRequest, probe: TensorDictBase
                        ) -> tuple[dict[Any, torch.Tensor], tuple[Any, torch.Tensor] | None]:
        """The patch's values as ``[records, *entry]`` and, with a version, ``(key, one
        incoming version per record)``; raises for anything that does not fit the stored data.
        """
        values = _check_patch(request.entries, probe, request.slots.shape)
        if request.version_key is None:
            return values, None
        return values, _version_entry(request.version_key, request.version, request.entries,
                                      probe, request.flat.numel())

    def _apply(self, request: _UpdateRequest) -> ConditionalUpdateResult:
        """Check ``request`` against the stored data and patch the live records, under the
        buffer's lock."""
        storage, flat, records = self._storage, request.flat, request.flat.numel()
        with self._lock:
            probe = self._probe()
            if probe is not None:
                values, versioned = self._checked_values(request, probe)
            if probe is None or not len(storage):  # (an emptied storage: the patch checked)
                return ConditionalUpdateResult(
                    torch.zeros(records, dtype=torch.bool),
                    None if request.version_key is None else torch.zeros(records,
                                                                         dtype=torch.bool))
            live = (self._writer.generations_of(flat).cpu() == request.captured)
            live &= (request.captured >= 0) & storage.valid_slots_mask(flat).cpu()
            rejected = None
            if versioned is not None:
                key, incoming = versioned
                rejected = torch.zeros(records, dtype=torch.bool)
                if live.any():
                    stored = storage.get(flat[live]).get(key).reshape(-1).cpu()
                    new = incoming[live].cpu()
                    ok = new > stored if request.require_newer else new >= stored
                    ok &= _keep_best_per_slot(flat[live], new)
                    rejected[live] = ~ok
                    live[live.clone()] = ok
                values[key] = incoming.reshape((records, *probe.get(key).shape[1:]))
            if live.any():
                self._write_patch(flat[live], {k: v[live.to(v.device)] for k, v in
                                               values.items()})
        return ConditionalUpdateResult(live, rejected)

    def _write_patch(self, slots: torch.Tensor, values: dict[Any, torch.Tensor]) -> None:
        """Write checked entries at ``slots`` (lock held) and tell the sampler."""
        storage = self._storage
        shape = storage.shape
        if storage.ndim > 1 and shape is not None:
            where: Any = torch.unravel_index(slots, tuple(shape))
        else:
            where = slots
        for key, value in values.items():
            storage.set_key(key, value, where)
        self._sampler.mark_edited(list(values))
        self._tell_readers_edited(list(values))  # other buffers of the storage (buffer_readers)
