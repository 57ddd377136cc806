"""``ReplayBufferEnsemble``: sample from several replay buffers at once."""

from __future__ import annotations

import textwrap
import threading
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import torch

from tdreplay.core import (
    ReplayBuffer,
    Sampler,
    Storage,
    Transform,
    Writer,
)
from tdreplay.core.buffer_draw import reads_undone_on_failure
from tdreplay.core.buffer_state import check_saved_parts_fit
from tdreplay.core.fork_safety import ForkGuard, guard_forks, left_locked, refusing_lock
from tdreplay.core.utils import check_flag, check_instance

from ._member_state import MEMBER_BUFFERS, MemberBufferStates
from ._members import select_members
from .collate import PartsCollate, stack_parts
from .priorities import EnsemblePrioritiesMixin
from .reads import EnsembleReadsMixin
from .routed_updates import RoutedUpdatesMixin
from .routing import RoutedWritesMixin, check_routing, refuse_write
from .sampler import SamplerEnsemble
from .sharing import EnsembleSharingMixin
from .storage import StorageEnsemble
from .streams import StreamEndingMixin
from .writer import WriterEnsemble


class _EnsembleLock(ForkGuard):
    """The ensemble's lock: its own re-entrant lock, then the lock of every member buffer.

    Holding the members' locks while the ensemble samples (or loads, or empties) means a
    thread extending ``rb[i]`` never races with the ensemble reading buffer ``i``. The locks
    are taken all at once or not at all: each is entered only if it is free
    (``enter_if_free``), and when one is busy the others are given back before waiting for it.
    A thread inside one member's ``locked()`` that samples the ensemble while another thread
    samples it therefore never deadlocks (waiting for the busy member while holding the
    ensemble's own lock would), whatever order the threads took the locks in. Across a fork,
    the forking thread holds its own lock (the members' locks guard themselves), see
    :mod:`tdreplay.core.fork_safety`.
    """

    __slots__ = ("_own", "_members", "__weakref__")

    def __init__(self, buffers: Sequence[ReplayBuffer]) -> None:
        self._own = threading.RLock()
        # each member buffer once (an ensemble may list one several times), in ensemble order
        self._members = tuple({id(rb): rb for rb in buffers}.values())
        guard_forks(self)

    def hold(self, timeout: float | None = None) -> bool:
        return bool(self._own.acquire(timeout=timeout or 0))  # (0: without waiting)

    def release(self) -> None:
        self._own.release()

    def reset_in_child(self, held: bool) -> None:
        if not held and left_locked(self._own):
            self._own = refusing_lock("This replay buffer ensemble")

    def __enter__(self) -> _EnsembleLock:
        while True:
            busy = self._enter_all_free()
            if busy is None:
                return self
            with busy:  # wait for it, holding nothing; then try them all again
                pass

    def enter_if_free(self) -> bool:
        """Take the ensemble's lock and every member's if all are free (re-entrant for the
        thread holding them); else take none and return ``False`` at once."""
        return self._enter_all_free() is None

    def _enter_all_free(self) -> Any:
        """Enter every lock if all are free (``None``); else give back those entered and
        return a busy one (a context manager to wait on)."""
        if not self._own.acquire(blocking=False):
            return self._own
        entered: list[ReplayBuffer] = []
        try:
            for rb in self._members:
                lock = rb.locked()
                if not lock.enter_if_free():
                    self._leave(entered)
                    return lock
                entered.append(rb)
        except BaseException:
            self._leave(entered)
            raise
        return None

    def _leave(self, entered: Sequence[ReplayBuffer]) -> None:
        for rb in reversed(entered):
            rb.locked().__exit__(None, None, None)
        self._own.release()

    def __exit__(self, *exc_info: Any) -> None:
        try:
            for rb in reversed(self._members):
                rb.locked().__exit__(*exc_info)
        finally:
            self._own.release()


def _callable_name(fn: Callable[..., Any]) -> str:
    name = getattr(fn, "__qualname__", None)
    if name is None:
        return repr(fn)
    module = getattr(fn, "__module__", None)
    return f"{module}.{name}" if module else name


def _check_collate_fns(collate_fns: Any, n: int) -> list[Callable[[Any], Any]] | None:
    if collate_fns is None:
        return None
    if isinstance(collate_fns, (str, bytes)) or not isinstance(collate_fns, Sequence):
        raise TypeError(f"collate_fns must be a sequence with one callable per buffer, got "
                        f"{type(collate_fns).__name__}.")
    if len(collate_fns) != n:
        raise ValueError(f"collate_fns must have one entry per buffer ({n}), got "
                         f"{len(collate_fns)}.")
    for i, fn in enumerate(collate_fns):
        if not callable(fn):
            raise TypeError(f"collate_fns[{i}] must be callable, got {type(fn).__name__}.")
    return list(collate_fns)


class ReplayBufferEnsemble(RoutedWritesMixin, RoutedUpdatesMixin, StreamEndingMixin,
                           EnsembleSharingMixin, EnsembleReadsMixin, EnsemblePrioritiesMixin,
                           ReplayBuffer):
    """An ensemble of replay buffers: one ``sample`` draws from several buffers at once.

    It composes a :class:`StorageEnsemble`, a :class:`SamplerEnsemble` and a
    :class:`WriterEnsemble`. Index it to get one of its buffers and extend that one
    (``rb[0].extend(data)``). Built with ``routing_key`` or ``routing_dim``, its own
    :meth:`extend` and :meth:`add` route each record to its buffer (see
    :mod:`tdreplay.ensembles.routing`); otherwise writing to the ensemble itself is refused.

    There are two ways to build one: pass the replay buffers, or pass the three component
    ensembles (``storages=``, ``samplers=``, ``writers=``), as for other buffers.

    A ``sample(batch_size)``:

    1. draws ``num_buffer_sampled`` buffers (weighted by ``p``, or all of them with
       ``sample_from_all``) and splits ``batch_size`` evenly among them;
    2. reads each part with its buffer's sampler and storage, collates it with that buffer's
       ``collate_fn`` and runs that buffer's transform on it;
    3. joins the parts with ``collate_fn`` (by default :func:`stack_parts`: stacked along a new
       leading dimension when they agree, so ``[parts, part_size, ...]``, else a list);
    4. runs the ensemble's ``transform``;
    5. writes ``index`` into a TensorDict sample: a sub-TensorDict with ``"index"`` (the slots
       in each part's buffer) and ``"buffer_ids"`` (the buffer each item came from), of the
       sample's shape, plus the samplers' info entries (e.g. ``priority_weight``) and, when
       every buffer's writer tracks generations, ``"index_generation"`` (as TorchRL's): the
       handles :meth:`update_if_present` takes.

    Parameters
    ----------
    *rbs : ReplayBuffer
        The replay buffers to ensemble (their storages, samplers, writers, transforms and
        collate functions are shared, not copied).
    storages : StorageEnsemble, optional
        The storages, when no buffers are passed.
    samplers : SamplerEnsemble, optional
        The samplers, when no buffers are passed (carrying ``p``, ``sample_from_all`` and
        ``num_buffer_sampled``).
    writers : WriterEnsemble, optional
        The writers, when no buffers are passed.
    transform : Transform or callable, optional
        The transform of the ensemble, run on the joined batch. Each buffer's own transform
        comes from that buffer (or from ``storages.transforms``).
    batch_size : int, optional
        Default batch size of :meth:`sample`.
    collate_fn : callable, optional
        Joins the list of collated, transformed parts. Defaults to :func:`stack_parts`.
    collate_fns : list of callables, optional
        The ``collate_fn`` of each buffer. Taken from the buffers (or their storages' defaults)
        when not given.
    p : sequence of float, Tensor or ``"sampleable"``, optional
        Relative weight of each buffer (see :class:`SamplerEnsemble`). Not compatible with
        ``sample_from_all``.
    sample_from_all : bool
        Take one part from every buffer. Defaults to ``False``.
    num_buffer_sampled : int, optional
        Number of parts per batch, each from one buffer drawn with replacement (so it may
        exceed the number of buffers); defaults to the number of buffers.
    routing_key : NestedKey, optional
        The entry holding each record's buffer id: :meth:`extend` and :meth:`add` then write
        each record into that buffer (TorchRL's routed writes).
    routing_dim : int, optional
        The batch dimension of the data whose entries are the buffers (its size must be the
        number of buffers): :meth:`extend` then writes ``data.select(routing_dim, i)`` into
        buffer ``i``. Not with ``routing_key``.
    pin_memory, prefetch, generator
        As for :class:`~tdreplay.core.ReplayBuffer`.
    shared : bool
        Mark the ensemble and its buffers as used by several processes (:meth:`share`).

    Notes
    -----
    - ``rb[i]`` is the i-th buffer (built from the i-th components as a
      :class:`~tdreplay.core.ReplayBuffer` when the ensemble was built from components);
      ``rb[1:]`` or ``rb[[0, 2]]`` a smaller ensemble sharing the same buffers;
      ``rb[i, idx]`` is ``rb[i][idx]``. ``len(rb)`` is the number of buffers, as in TorchRL.
    - ``p`` and ``num_buffer_sampled`` given with components belong to the
      :class:`SamplerEnsemble`; passing them here as well is refused.
    - :meth:`state_dict` and :meth:`dumps` (one atomic checkpoint) save every buffer's storage,
      sampler (with its generator), writer and transforms' state, and the ensemble's own.
      ``routing_key`` / ``routing_dim`` are configuration, not state: they are not saved (as
      TorchRL), so build the restored ensemble with the same ones. A smaller ensemble
      (``rb[1:]``) is not routed (as TorchRL): the ids would name other buffers.
    - It may go to another process only if every buffer's parts may (see :meth:`share`).

    Examples
    --------
    >>> import torch
    >>> from tensordict import TensorDict
    >>> from tdreplay.core import ListStorage, TensorDictReplayBuffer
    >>> rb0 = TensorDictReplayBuffer(storage=ListStorage(10),
    ...                              transform=lambda td: td.set("obs", td["obs"] * 10))
    >>> rb1 = TensorDictReplayBuffer(storage=ListStorage(10))
    >>> rb = ReplayBufferEnsemble(rb0, rb1, sample_from_all=True, batch_size=6)
    >>> _ = rb[0].extend(TensorDict(obs=torch.ones(4), batch_size=[4]))
    >>> _ = rb[1].extend(TensorDict(obs=torch.ones(4), batch_size=[4]))
    >>> sample = rb.sample()
    >>> sample.batch_size, sample["obs"][:, 0].tolist()
    (torch.Size([2, 3]), [10.0, 1.0])
    >>> sample["index", "buffer_ids"].tolist()
    [[0, 0, 0], [1, 1, 1]]
    >>> rb.extend(TensorDict(obs=torch.ones(4), batch_size=[4]))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    RuntimeError: ReplayBufferEnsemble.extend: an ensemble cannot be written to; ...
    >>> routed = ReplayBufferEnsemble(rb0, rb1, routing_dim=0)
    >>> handles = routed.extend(TensorDict(obs=torch.zeros(2, 3), batch_size=[2, 3]))
    >>> handles["buffer_ids"].tolist(), handles["index"].tolist(), len(rb0), len(rb1)
    ([0, 0, 0, 1, 1, 1], [4, 5, 6, 4, 5, 6], 7, 7)
    """

    #: the member buffers (empty until ``__init__`` sets them: the base ``__init__`` may call
    #: ``clear_prefetch`` first)
    _rbs: tuple[ReplayBuffer, ...] = ()

    def __init__(
        self,
        *rbs: ReplayBuffer,
        storages: StorageEnsemble | None = None,
        samplers: SamplerEnsemble | None = None,
        writers: WriterEnsemble | None = None,
        transform: Transform | Callable[[Any], Any] | None = None,
        batch_size: int | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        collate_fns: Sequence[Callable[[Any], Any]] | None = None,
        p: Sequence[float] | torch.Tensor | str | None = None,
        sample_from_all: bool = False,
        num_buffer_sampled: int | None = None,
        routing_key: Any = None,
        routing_dim: int | None = None,
        pin_memory: bool = False,
        prefetch: int | None = None,
        generator: torch.Generator | None = None,
        shared: bool = False,
    ) -> None:
        routing = check_routing(routing_key, routing_dim)
        shared = check_flag(shared, "shared")  # (the flags first: nothing built yet)
        sample_from_all = check_flag(sample_from_all, "sample_from_all")
        pin_memory = check_flag(pin_memory, "pin_memory")
        if collate_fn is not None and not callable(collate_fn):
            raise TypeError(f"collate_fn must be callable, got {type(collate_fn).__name__}.")
        buffers: list[ReplayBuffer] | None
        if rbs:
            given = [name for name, value in (("storages", storages), ("samplers", samplers),
                                              ("writers", writers)) if value is not None]
            if given:
                raise ValueError(f"pass either replay buffers or {', '.join(given)}, not both.")
            for i, rb in enumerate(rbs):
                if not isinstance(rb, ReplayBuffer):
                    raise TypeError(f"rbs[{i}] must be a ReplayBuffer, got {type(rb).__name__}.")
                if isinstance(rb, ReplayBufferEnsemble):
                    raise TypeError(f"rbs[{i}] is a ReplayBufferEnsemble: ensembles do not nest.")
            collate_fns = _check_collate_fns(collate_fns, len(rbs)) or [rb.collate_fn
                                                                         for rb in rbs]
            storages = StorageEnsemble(*(rb.storage for rb in rbs),
                                       transforms=[rb.transform for rb in rbs])
            samplers = SamplerEnsemble(*(rb.sampler for rb in rbs), p=p,
                                       sample_from_all=sample_from_all,
                                       num_buffer_sampled=num_buffer_sampled)
            writers = WriterEnsemble(*(rb.writer for rb in rbs))
            buffers = list(rbs)
        else:
            if storages is None or samplers is None or writers is None:
                missing = [name for name, value in (("storages", storages), ("samplers", samplers),
                                                    ("writers", writers)) if value is None]
                raise ValueError("ReplayBufferEnsemble needs replay buffers, or all of storages, "
                                 f"samplers and writers (missing: {', '.join(missing)}).")
            check_instance(storages, StorageEnsemble, "storages")
            check_instance(samplers, SamplerEnsemble, "samplers")
            check_instance(writers, WriterEnsemble, "writers")
            if p is not None or sample_from_all or num_buffer_sampled is not None:
                raise ValueError("p, sample_from_all and num_buffer_sampled are set on the "
                                 "SamplerEnsemble when the ensemble is built from components.")
            n = len(storages)
            if len(samplers) != n or len(writers) != n:
                raise ValueError(f"storages, samplers and writers must have one member per "
                                 f"buffer; got {n} storages, {len(samplers)} samplers and "
                                 f"{len(writers)} writers.")
            collate_fns = _check_collate_fns(collate_fns, n) or [
                storage.default_collate for storage in storages.storages]
            buffers = None
        super().__init__(storage=storages, sampler=samplers, writer=writers, transform=transform,
                         batch_size=batch_size, pin_memory=pin_memory, prefetch=prefetch,
                         generator=generator)
        self._storage_ensemble: StorageEnsemble = storages  # self._storage, typed as what it is
        self._sampler_ensemble: SamplerEnsemble = samplers  # self._sampler, likewise
        if buffers is None:
            transforms = storages.transforms or [None] * len(storages)
            buffers = [
                ReplayBuffer(storage=storage, sampler=sampler, writer=writer, transform=t,
                             collate_fn=fn)
                for storage, sampler, writer, t, fn in zip(
                    storages.storages, samplers.samplers, writers.writers, transforms, collate_fns)
            ]
        self._rbs: tuple[ReplayBuffer, ...] = tuple(buffers)
        # joins the parts; the collate_fn and collate_fns properties read it back
        self._parts = PartsCollate(self._rbs, collate_fns,
                                   collate_fn if collate_fn is not None else stack_parts)
        self._collate_fn = self._parts
        self._lock = _EnsembleLock(self._rbs)
        self._routing_key, self._routing_dim = routing  # configuration, never saved
        self.register_stateful(MEMBER_BUFFERS, MemberBufferStates(self._rbs))  # their transforms
        if shared:
            self.share()  # the buffers too, now that they are known

    # ---- components -----------------------------------------------------------------------------
    @property
    def buffers(self) -> tuple[ReplayBuffer, ...]:
        """The member buffers."""
        return self._rbs

    @property
    def restored_together(self) -> tuple[ReplayBuffer, ...]:
        """The member buffers: the ensemble's restores and ``empty`` set their states (see
        :attr:`ReplayBuffer.restored_together <tdreplay.core.ReplayBuffer.restored_together>`).

        Examples
        --------
        >>> from tdreplay.core import ListStorage, ReplayBuffer
        >>> a, b = ReplayBuffer(storage=ListStorage(4)), ReplayBuffer(storage=ListStorage(4))
        >>> ReplayBufferEnsemble(a, b).restored_together == (a, b)
        True
        """
        return self._rbs

    @property
    def collate_fn(self) -> Callable[[list[Any]], Any]:
        """The function joining the parts of a batch."""
        return self._parts.join

    @property
    def collate_fns(self) -> list[Callable[[Any], Any]]:
        """The ``collate_fn`` of each buffer."""
        return list(self._parts.collate_fns)

    @staticmethod
    def _refuse_replace(method: str) -> RuntimeError:
        return RuntimeError(f"ReplayBufferEnsemble.{method}: the components of an ensemble cannot "
                            "be replaced; build a new ensemble (or replace the component of one "
                            "buffer, rb[i]).")

    def set_storage(self, storage: Storage, collate_fn: Callable[[Any], Any] | None = None
                    ) -> Storage:
        raise self._refuse_replace("set_storage")

    def set_sampler(self, sampler: Sampler) -> Sampler:
        raise self._refuse_replace("set_sampler")

    def set_writer(self, writer: Writer) -> Writer:
        raise self._refuse_replace("set_writer")

    # ---- writing: routed extend / add (routing.py), anything else is refused -------------------
    @staticmethod
    def _refuse_write(method: str) -> RuntimeError:
        return refuse_write(method)

    def __setitem__(self, index: Any, value: Any) -> None:
        raise self._refuse_write("__setitem__")

    def write_all(self, data: Any, end: int | None = None) -> None:
        raise self._refuse_write("write_all")

    def set_(self, key: Any, value: Any) -> NoReturn:
        raise self._refuse_write("set_")

    def set_at_(self, key: Any, value: Any, index: Any) -> NoReturn:
        raise self._refuse_write("set_at_")

    def update_(self, input_dict_or_td: Any, clone: bool = False, *,
                keys_to_update: Any = None) -> NoReturn:
        raise self._refuse_write("update_")

    # ---- reading --------------------------------------------------------------------------------
    def __len__(self) -> int:
        """Number of buffers."""
        return len(self._rbs)

    def __getitem__(self, index: Any) -> Any:
        """``rb[i]``: the i-th buffer; ``rb[1:]`` / ``rb[[0, 2]]``: a smaller ensemble;
        ``rb[i, idx]``: ``rb[i][idx]``; ``rb[:, idx]``: ``idx`` of every buffer, joined."""
        if isinstance(index, tuple):
            if not index:
                return self
            if len(index) == 1:
                return self[index[0]]
            rest = index[1] if len(index) == 2 else index[1:]
            positions = select_members(index[0], len(self._rbs), "buffers")
            if isinstance(positions, int):
                return self._rbs[positions][rest]
            if self.has_read_state:  # transforms with state: put back if a step raises
                with reads_undone_on_failure(self):
                    return self._read_joined(positions, rest)
            return self._read_joined(positions, rest)
        positions = select_members(index, len(self._rbs), "buffers")
        if isinstance(positions, int):
            return self._rbs[positions]
        p = self._sampler_ensemble.p
        if isinstance(p, torch.Tensor) and not bool(p[positions].any()):
            raise ValueError(f"index {index!r} selects buffers {positions}, which all have "
                             f"weight 0 in the ensemble's p={p.tolist()}: an ensemble of them "
                             "could never be sampled. Build it with ReplayBufferEnsemble(*rbs, "
                             "p=...) and the weights it should have.")
        return ReplayBufferEnsemble(
            *(self._rbs[i] for i in positions),
            transform=self._transform,
            batch_size=self._batch_size,
            collate_fn=self._parts.join,
            collate_fns=[self._parts.collate_fns[i] for i in positions],
            p=p[positions] if isinstance(p, torch.Tensor) else p,
            sample_from_all=self._sampler_ensemble.sample_from_all,
            num_buffer_sampled=self._sampler_ensemble.requested_num_buffer_sampled,
            pin_memory=self._pin_memory,
            prefetch=self._prefetch or None,
            generator=self._rng,
            shared=self.shared,
        )

    def holds_lock(self) -> bool:
        """Whether the calling thread holds the lock of a member buffer (the ensemble's lock
        holds them all; see :meth:`ReplayBuffer.holds_lock`)."""
        return any(rb.holds_lock() for rb in self._rbs)

    # ---- read-side state: the ensemble's transform and its members' ----------------------------
    @property
    def has_read_state(self) -> bool:
        """Whether a read changes state that a failed read must put back: transforms with
        state, the ensemble's own or a member's (the members' run inside the ensemble's
        ``collate_fn``, before the ensemble's transform).

        Examples
        --------
        >>> from tdreplay.core import ReplayBuffer
        >>> from tdreplay.transforms import VecNorm
        >>> plain = ReplayBufferEnsemble(ReplayBuffer(), ReplayBuffer())
        >>> normed = ReplayBufferEnsemble(ReplayBuffer(),
        ...                               ReplayBuffer(transform=VecNorm(in_keys=["obs"])))
        >>> plain.has_read_state, normed.has_read_state
        (False, True)
        """
        return super().has_read_state or any(rb.has_read_state for rb in self._rbs)

    def mark_read_state(self) -> Any:
        """A copy of the state of the ensemble's transforms with state and of its members',
        for :meth:`undo_read_state` (see :meth:`ReplayBuffer.mark_read_state`)."""
        return super().mark_read_state(), [rb.mark_read_state() for rb in self._rbs]

    def undo_read_state(self, mark: Any) -> None:
        """Put back what :meth:`mark_read_state` copied, the members' state included."""
        own, members = mark
        for rb, member_mark in zip(self._rbs, members, strict=True):
            rb.undo_read_state(member_mark)
        super().undo_read_state(own)

    # ---- state ----------------------------------------------------------------------------------
    def check_saveable(self) -> None:
        """As :meth:`ReplayBuffer.check_saveable <tdreplay.core.ReplayBuffer.check_saveable>`,
        for the ensemble and each member: a member whose last restore failed while installing
        is not saved through the ensemble either (``RuntimeError`` naming the member)."""
        super().check_saveable()
        for i, rb in enumerate(self._rbs):
            try:
                rb.check_saveable()
            except RuntimeError as err:
                raise RuntimeError(f"member {i} of the ensemble: {err}") from err

    def check_saved_parts(self, state_dict: dict[str, Any]) -> None:
        """As :meth:`ReplayBuffer.check_saved_parts`, member by member: a member writer's
        cursor past its storage's saved rows, or a member sampler's slots past them, is refused
        (``ValueError`` naming the member)."""
        for i, rb in enumerate(self._rbs):
            check_saved_parts_fit(rb.storage, rb.writer, rb.sampler, state_dict, member=str(i))

    # ---- lifecycle ------------------------------------------------------------------------------
    def empty(self, empty_write_count: bool = True) -> None:
        """As :meth:`ReplayBuffer.empty <tdreplay.core.ReplayBuffer.empty>`; the items the
        members' transforms hold back (a member's ``MultiStepTransform``) are dropped too."""
        with self._lock:
            super().empty(empty_write_count)
            for rb in self._rbs:  # (what their storages, emptied with the ensemble, do not
                # tell them: restored_together)
                rb.transform.drop_held_items()
                if rb.rate_limiter is not None:
                    rb.rate_limiter.reset()

    def clear_prefetch(self) -> None:
        super().clear_prefetch()
        for rb in self._rbs:
            rb.clear_prefetch()

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._lock = _EnsembleLock(self._rbs)

    def __repr__(self) -> str:
        storages = textwrap.indent(f"storages={self._storage!r}", " " * 4)
        samplers = textwrap.indent(f"samplers={self._sampler!r}", " " * 4)
        writers = textwrap.indent(f"writers={self._writer!r}", " " * 4)
        return (f"{type(self).__name__}(\n{storages},\n{samplers},\n{writers},\n"
                f"batch_size={self._batch_size},\ntransform={self._transform!r},\n"
                f"collate_fn={_callable_name(self._parts.join)})")
