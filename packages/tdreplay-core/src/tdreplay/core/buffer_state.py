"""Saving and restoring a buffer: ``state_dict`` / ``load_state_dict``, ``dumps`` / ``loads``.

:class:`BufferStateMixin` is one of the rooms :class:`~tdreplay.core.ReplayBuffer` is built
from: it saves and restores the storage, the sampler, the writer and the generator as one
step, under the buffer's lock, and checks everything before it changes anything.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ._installing import InstallRecord
from ._prefetch_files import load_prefetched, save_prefetched
from .checkpoint import (
    CheckpointError,
    load_torch_file,
    open_checkpoint,
    read_json,
    save_torch_file,
    write_checkpoint,
    write_json,
)
from .prefetch import Prefetcher
from .process_sharing import sending_to_new_process
from .sampler import Sampler
from .stateful_parts import StatefulPart, StatefulParts
from .storage import Storage
from .storage_checkpointer import checked_seam
from .storage_readers import StorageReaders
from .transform import Compose
from .transform_state import (
    check_transform_state,
    dump_transform_state,
    prepare_transform_load,
    transform_state,
)
from .writer import RoundRobinWriter, Writer

#: what a pickled buffer leaves behind: its locks, its prefetch worker and the batches it drew
#: ahead, the process it belongs to, and its place among the readers of its storage (the copy
#: takes its own, :mod:`~tdreplay.core.buffer_readers`)
_IN_THIS_PROCESS = ("_lock", "_prefetcher", "_owner_pid", "_next_batches", "_readers")


def check_saved_parts_fit(storage: Storage, writer: Writer, sampler: Sampler,
                          state_dict: dict[str, Any], member: str | None = None) -> None:
    """Raise ``ValueError`` naming the entry unless the saved states of a buffer's parts
    (``state_dict["_storage"]``, ``["_writer"]``, ``["_sampler"]``, each accepted by its
    part's ``check_state_dict``) fit together: the writer can go on writing into the rows the
    storage state holds (:meth:`Writer.check_saved_rows
    <tdreplay.core.Writer.check_saved_rows>`) and the sampler draws no slot past them
    (:meth:`Sampler.check_saved_slots <tdreplay.core.Sampler.check_saved_slots>`; storages of
    one dim, where a row is a slot). ``member``: the key of each part's state under the
    entries, for a buffer made of others (an ensemble's member ``"0"``).

    Examples
    --------
    >>> from tdreplay.core import ListStorage, RandomSampler, RoundRobinWriter
    >>> storage, writer = ListStorage(4), RoundRobinWriter()
    >>> writer.register_storage(storage)
    >>> state = {"_storage": {"storage": [1, 2], "max_size": 4},
    ...          "_writer": {"cursor": 3, "write_count": 3}, "_sampler": {}}
    >>> check_saved_parts_fit(storage, writer, RandomSampler(), state)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: state_dict['_writer']: RoundRobinWriter state_dict['cursor'] is 3 but ...
    """
    def saved(name: str) -> Any:
        return state_dict[name] if member is None else state_dict[name][member]

    rows = storage.saved_rows(saved("_storage"))
    if rows is None:
        return
    name = "_writer"
    try:
        writer.check_saved_rows(saved(name), rows)
        name = "_sampler"
        if storage.ndim == 1:  # (a row is a slot)
            sampler.check_saved_slots(saved(name), rows)
    except ValueError as err:
        where = f"state_dict[{name!r}]" + ("" if member is None else f"[{member!r}]")
        raise ValueError(f"{where}: {err}") from err


def tell_save_hooks(storage: Storage, writer: Writer) -> None:
    """Give the save hooks that declare TorchRL's ``shift`` / ``is_full`` attributes where the
    next write goes and whether the storage is full, before they see the saved contents.

    ``shift`` is the row the writer writes next (a :class:`RoundRobinWriter`'s cursor; the
    number of written rows for other writers), ``is_full`` whether every slot is written. A
    hook uses them e.g. to save trajectories in time order. Hooks without them are untouched.

    Examples
    --------
    >>> from tdreplay.core import ListStorage, ReplayBuffer
    >>> class Hook:
    ...     shift = is_full = None
    ...     def __call__(self, data):
    ...         return data
    >>> rb, hook = ReplayBuffer(storage=ListStorage(10)), Hook()
    >>> rb.register_save_hook(hook)
    >>> _ = rb.extend(range(5))
    >>> tell_save_hooks(rb.storage, rb.writer)
    >>> hook.shift, hook.is_full
    (5, False)
    """
    hooks = [hook for hook in storage.save_hooks
             if hasattr(hook, "shift") or hasattr(hook, "is_full")]  # TorchRL's hook protocol
    if not hooks:
        return
    rows = len(storage) // max(storage.row_numel, 1)
    shift = writer.cursor if isinstance(writer, RoundRobinWriter) else rows
    for hook in hooks:
        if hasattr(hook, "shift"):
            hook.shift = int(shift)
        if hasattr(hook, "is_full"):
            hook.is_full = len(storage) == storage.max_size


class BufferStateMixin:
    """State and checkpoints of a replay buffer (mixed into :class:`ReplayBuffer`)."""

    _storage: Storage
    _sampler: Sampler
    _writer: Writer
    _transform: Compose
    _rng: torch.Generator | None
    _batch_size: int | None
    _lock: AbstractContextManager[Any]
    _prefetcher: Prefetcher
    _reset_count_seen: int | None  # (SharingMixin: the reset count its prefetched batches know)
    _stateful: StatefulParts | None = None  # created by the first register_stateful
    #: whether the last restore failed while installing (made by the first restore)
    _install_record: InstallRecord | None = None

    if TYPE_CHECKING:  # what the buffer this is mixed into provides
        def clear_prefetch(self) -> None: ...

        def holds_lock(self) -> bool: ...

        def __setstate__(self, state: dict[str, Any]) -> None: ...

        def _await_submitted_updates(self) -> None: ...

        _readers: StorageReaders

        def _followed_own_reset(self) -> None: ...

        def _replacing_rows_itself(self) -> AbstractContextManager[Any]: ...

        def check_shareable(self) -> None: ...

        def set_rng(self, generator: torch.Generator) -> None: ...

        @property
        def write_count(self) -> int: ...

        @property
        def initialized(self) -> bool: ...

        def pending_stats(self) -> dict[str, int | float | bool]: ...

        def __len__(self) -> int: ...

    def register_save_hook(self, hook: Callable[[Any], Any]) -> None:
        """Register ``hook(data) -> data`` applied to the storage contents before saving."""
        self._storage.register_save_hook(hook)

    def register_load_hook(self, hook: Callable[[Any], Any]) -> None:
        """Register ``hook(data) -> data`` applied to the storage contents after loading."""
        self._storage.register_load_hook(hook)

    def register_stateful(self, name: str, part: StatefulPart | None) -> None:
        """Save and restore ``part`` with the buffer, under ``name`` (``None`` unregisters).

        ``part`` has ``state_dict()``, ``check_state_dict(state)`` and
        ``load_state_dict(state)``; :meth:`state_dict` / :meth:`dumps` then save its state and
        :meth:`load_state_dict` / :meth:`loads` check it with the rest before restoring it (a
        checkpoint without it is refused). E.g. a ``LinearScheduler`` built on a buffer
        registers itself. See :mod:`tdreplay.core.stateful_parts`.

        Examples
        --------
        >>> from tdreplay.core import ListStorage, ReplayBuffer
        >>> class Counter:
        ...     n = 0
        ...     def state_dict(self): return {"n": self.n}
        ...     def check_state_dict(self, state): pass
        ...     def load_state_dict(self, state): self.n = state["n"]
        >>> rb, counter = ReplayBuffer(storage=ListStorage(4)), Counter()
        >>> rb.register_stateful("counter", counter)
        >>> counter.n = 5
        >>> rb.state_dict()["_stateful"]
        {'counter': {'n': 5}}
        """
        with self._lock:  # (state_dict reads the parts under it)
            self.stateful_parts.register(name, part)

    @property
    def stateful_parts(self) -> StatefulParts:
        """The parts registered with :meth:`register_stateful` (none yet: empty), for what
        saves this buffer's state beside its components: a
        :class:`~tdreplay.ensembles.ReplayBufferEnsemble` saves its member buffers' this way.

        Examples
        --------
        >>> from tdreplay.core import ListStorage, ReplayBuffer
        >>> ReplayBuffer(storage=ListStorage(4)).stateful_parts.names  # (see register_stateful)
        ()
        """
        with self._lock:  # (made at the first use: most buffers register none)
            if self._stateful is None:
                self._stateful = StatefulParts()
            return self._stateful

    def stats(self) -> dict[str, int | float | bool]:
        """A cheap, JSON-ready snapshot of the buffer's counters, as TorchRL's ``stats()``.

        Entries: ``size`` (``len(buffer)``), ``write_count`` (items written through ``add``
        and ``extend``; 0 for a writer that does not write, e.g. ``ImmutableDatasetWriter``),
        ``prefetch_queue_size`` (batches drawn ahead), ``initialized`` (``False``: a buffer
        with ``delayed_init`` not used yet, see :meth:`pending_stats`), ``capacity`` (the
        storage's ``max_size``) and ``utilization`` (``size / capacity``). Reads no data and
        changes nothing.

        Examples
        --------
        >>> from tdreplay.core import ListStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=ListStorage(10))
        >>> _ = rb.extend(range(4))
        >>> rb.stats()  # doctest: +NORMALIZE_WHITESPACE
        {'size': 4, 'write_count': 4, 'prefetch_queue_size': 0, 'initialized': True,
         'capacity': 10, 'utilization': 0.4}
        """
        if not self.initialized:
            return self.pending_stats()
        with self._lock:
            size, capacity = len(self), self._storage.max_size
            write_count, queued = self.write_count, self._prefetcher.queued
        return {"size": int(size), "write_count": int(write_count),
                "prefetch_queue_size": int(queued), "initialized": True,
                "capacity": int(capacity), "utilization": size / capacity if capacity else 0.0}

    def state_dict(self) -> dict[str, Any]:
        """Storage, sampler and writer state (and the generator's state when one is set).

        A buffer with ``prefetch`` also saves the batches it has drawn ahead (copies, under
        ``"_prefetch_state"``), after waiting for the ones being drawn: the restored buffer
        hands out the same batches next, then draws on as the saved one would.
        """
        with self._prefetcher.held(settle=True, lock_held=self.holds_lock()), self._lock:
            self.check_saveable()
            out: dict[str, Any] = {
                "_storage": self._storage.state_dict(),
                "_sampler": self._sampler.state_dict(),
                "_writer": self._writer.state_dict(),
                "_batch_size": self._batch_size,
                # (where the ring is cut: the writer's cursor does not say it when writes go
                # to freed slots, e.g. consumed ones, or to a max-value writer's chosen rows)
                "_last_written_row": self._storage.last_written_row,
            }
            if self._rng is not None:
                out["_rng"] = self._rng.get_state()
            if self._prefetcher.depth:
                out["_prefetch_state"] = self._prefetcher.export()
            if self._stateful:
                out["_stateful"] = self._stateful.state_dict()
            transforms = transform_state(self._transform)  # those with state (has_state)
            if transforms is not None:
                out["_transform"] = transforms
            out.update(self._state_under_lock())
        return out

    def _state_under_lock(self) -> dict[str, Any]:
        """Entries :meth:`state_dict` adds for the rooms mixed in after this one, read under
        the buffer's lock with the storage (e.g. the rate limiter's counts)."""
        return {}

    def __getstate__(self) -> dict[str, Any]:
        """Pickle the components and the batches drawn ahead (copies, once drawn: a copy
        samples as the original would); locks and the prefetch worker stay in this process.
        A buffer whose parts wait for its first use (``delayed_init``) pickles its arguments:
        the copy builds its own parts where it is used.

        The parts themselves are pickled after this returns, when the lock is no longer
        held: pickle a buffer that other threads write to inside ``with rb.locked():`` (or
        save it with :meth:`state_dict` / ``dumps``, which copy under the lock), else the copy
        may hold rows of a write that was under way. ``copy.deepcopy`` holds the lock
        throughout (:meth:`__deepcopy__`)."""
        if not self.initialized:
            return {name: value for name, value in self.__dict__.items()
                    if name not in _IN_THIS_PROCESS}
        if sending_to_new_process():  # a spawned child: refuse what it could not share
            self.check_shareable()
        with self._prefetcher.held(settle=True, lock_held=self.holds_lock()), self._lock:
            return self._state_to_copy()

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        """A copy made under the buffer's lock from start to end: one state the buffer was
        in, whatever other threads write meanwhile."""
        if not self.initialized:
            state = {name: value for name, value in self.__dict__.items()
                     if name not in _IN_THIS_PROCESS}
            copied = type(self).__new__(type(self))
            memo[id(self)] = copied
            copied.__setstate__(copy.deepcopy(state, memo))
            return copied
        with self._prefetcher.held(settle=True, lock_held=self.holds_lock()), self._lock:
            copied = type(self).__new__(type(self))
            memo[id(self)] = copied
            state = copy.deepcopy(self._state_to_copy(), memo)
            self._settle_copied_state(state)
            copied.__setstate__(state)
        return copied

    def _settle_copied_state(self, state: dict[str, Any]) -> None:
        """Adjust ``state``, this buffer's attributes deep-copied (its parts are the copy's),
        before the copy takes them. A deep copy's storage is a storage of its own (a
        memory-mapped one counts its making as a restore): the batches it drew ahead are of
        the rows it copied, unless this buffer's were already of replaced rows (then a count
        it never has: its next sample drops them)."""
        count = state["_storage"].shared_reset_count()
        if count is not None:
            current = self._reset_count_seen == self._storage.shared_reset_count()
            state["_reset_count_seen"] = count if current else -1

    def _state_to_copy(self) -> dict[str, Any]:
        """The attributes a copy takes (the caller holds the lock), the batches drawn ahead
        included."""
        state = self.__dict__.copy()
        for name in _IN_THIS_PROCESS:
            state.pop(name, None)
        if self._prefetcher.depth:
            state["_prefetch_state"] = self._prefetcher.export()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; checks every part before changing anything.

        A state of a buffer with another capacity, a writer cursor outside the storage, or a
        generator state that does not fit is refused with a ``ValueError`` naming the field,
        and the buffer stays as it was.

        Examples
        --------
        >>> from tdreplay.core import ListStorage, ReplayBuffer
        >>> small = ReplayBuffer(storage=ListStorage(4))
        >>> _ = small.extend([1, 2, 3, 4, 5])
        >>> big = ReplayBuffer(storage=ListStorage(8))
        >>> big.load_state_dict(small.state_dict())  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: state_dict['_storage']: state_dict['max_size'] is 4 but this ListStorage ...
        >>> len(big)
        0

        Batches a prefetching buffer had drawn ahead are restored too; a buffer of another
        ``prefetch`` depth refuses them with :class:`~tdreplay.core.prefetch.PrefetchStateError`
        (a ``ValueError`` and, as TorchRL's error, a ``RuntimeError``). Updates submitted
        before (``submit_update_if_present``) are done first: they patch the data they were
        submitted against, never the restored one.
        """
        self._await_submitted_updates()
        with self._prefetcher.held(settle=False), self._lock:
            steps = self._restore_steps(state_dict)
            self.clear_prefetch()
            self._install(steps)

    def check_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Raise as :meth:`load_state_dict` would refuse ``state_dict`` (``TypeError`` /
        ``ValueError`` naming the entry), changing nothing: every check it makes before the
        buffer changes (each component's, :meth:`check_saved_parts`, the registered parts',
        the transforms', the generator's and the prefetched batches'). A buffer made of others
        asks it of each before any loads (a sharded buffer's ``load_state_dict``, of every
        shard's buffer).

        Examples
        --------
        >>> from tdreplay.core import ListStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=ListStorage(4))
        >>> _ = rb.extend([1, 2])
        >>> state = rb.state_dict()
        >>> rb.check_state_dict(state)
        >>> ReplayBuffer(storage=ListStorage(8)).check_state_dict(state)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: state_dict['_storage']: state_dict['max_size'] is 4 but this ListStorage ...
        """
        with self._lock:
            self._restore_steps(state_dict)

    def _restore_steps(self, state_dict: Any) -> list[Callable[[], Any]]:
        """Check ``state_dict`` as a whole (nothing changes), then return the steps that
        install it, in order (the caller holds the lock)."""
        if not isinstance(state_dict, dict):
            raise TypeError(f"state_dict must be a dict, got {type(state_dict).__name__}.")
        missing = {"_storage", "_sampler", "_writer"} - set(state_dict)
        if missing:
            raise ValueError(f"state_dict is missing {sorted(missing)}.")
        prefetch_state = state_dict.get("_prefetch_state")
        self._prefetcher.check_state(prefetch_state, self._storage.max_size)
        for part, component in (("_storage", self._storage), ("_sampler", self._sampler),
                                ("_writer", self._writer)):
            try:
                component.check_state_dict(state_dict[part])
            except (ValueError, TypeError, KeyError) as err:
                raise ValueError(f"state_dict[{part!r}]: {err}") from err
        self.check_saved_parts(state_dict)
        newest = self._saved_newest_row(state_dict.get("_last_written_row"),
                                        "state_dict['_last_written_row']")
        if self._stateful:
            try:
                self._stateful.check_state_dict(state_dict.get("_stateful", {}))
            except ValueError as err:
                raise ValueError(f"state_dict['_stateful']: {err}") from err
        restore_transforms = check_transform_state(self._transform,
                                                   state_dict.get("_transform"))
        rng = self._generator_to_restore() if "_rng" in state_dict else None
        if rng is not None:  # a None state in it too is refused
            try:
                torch.Generator(device=rng.device).set_state(state_dict["_rng"])
            except (TypeError, RuntimeError) as err:
                raise ValueError(f"state_dict['_rng'] is not a state of this buffer's "
                                 f"generator: {err}") from err
        stateful = self._stateful
        return [
            lambda: self._storage.load_state_dict(state_dict["_storage"]),
            lambda: self._sampler.load_state_dict(state_dict["_sampler"]),
            lambda: self._writer.load_state_dict(state_dict["_writer"]),
            *([lambda: self._set_newest_row(newest)] if "_last_written_row" in state_dict
              else []),  # (older states: the writer's cursor tells it)
            # (checked above: a stateful part that may be missing is left as it is)
            *([lambda: self._restore_generator(rng, state_dict["_rng"])]
              if rng is not None else []),
            *([lambda: stateful.load_state_dict(state_dict.get("_stateful", {}))]
              if stateful else []),
            restore_transforms,
            lambda: self._prefetcher.restore(prefetch_state),
        ]

    def check_saved_parts(self, state_dict: dict[str, Any]) -> None:
        """Raise ``ValueError`` naming the entry unless the saved parts of ``state_dict``
        (each accepted by its part's ``check_state_dict``) fit together: the writer can go on
        writing into the rows the storage state holds (:meth:`Storage.saved_rows
        <tdreplay.core.Storage.saved_rows>`, :meth:`Writer.check_saved_rows
        <tdreplay.core.Writer.check_saved_rows>`) and the sampler draws none past them
        (:meth:`Sampler.check_saved_slots <tdreplay.core.Sampler.check_saved_slots>`):
        :func:`check_saved_parts_fit`. :meth:`load_state_dict` calls it before anything
        loads; a buffer made of others (an ensemble) checks each of them.

        Examples
        --------
        >>> from tdreplay.core import ListStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=ListStorage(8))
        >>> _ = rb.extend([1, 2, 3])
        >>> state = rb.state_dict()
        >>> rb.check_saved_parts(state)
        >>> state["_storage"]["storage"] = [1]  # a cursor at 3 would leave a gap
        >>> rb.check_saved_parts(state)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: state_dict['_writer']: RoundRobinWriter state_dict['cursor'] is 3 but ...
        """
        check_saved_parts_fit(self._storage, self._writer, self._sampler, state_dict)

    def _components(self) -> dict[str, Any]:
        return {"storage": self._storage, "sampler": self._sampler, "writer": self._writer}

    def dumps(self, path: str | os.PathLike[str]) -> None:
        """Save storage, sampler and writer state under directory ``path``, atomically.

        The new checkpoint is written beside the previous one and committed by an atomic
        rename; a crash mid-way leaves the previous checkpoint loadable.

        Examples
        --------
        >>> import tempfile
        >>> from tdreplay.core import ListStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=ListStorage(5))
        >>> _ = rb.extend([1, 2, 3])
        >>> with tempfile.TemporaryDirectory() as d:
        ...     rb.dumps(d)
        ...     restored = ReplayBuffer(storage=ListStorage(5))
        ...     restored.loads(d)
        >>> restored[:], restored.write_count
        ([1, 2, 3], 3)
        """
        with self._prefetcher.held(settle=True, lock_held=self.holds_lock()), self._lock:
            self.check_saveable()
            tell_save_hooks(self._storage, self._writer)
            with write_checkpoint(path) as snap:
                meta = {"buffer": type(self).__name__, "len": len(self),
                        "write_count": self.write_count,
                        "last_written_row": self._storage.last_written_row}
                for name, component in self._components().items():
                    meta[name] = type(component).__name__
                    component.dumps(snap / name)
                if self._stateful:
                    meta["stateful"] = self._stateful.dumps(snap / "stateful")
                dump_transform_state(self._transform, snap)
                write_json(snap / "buffer.json", meta)
                if self._rng is not None:
                    save_torch_file(self._rng.get_state(), snap / "rng.pt")
                save_prefetched(snap, self._prefetcher.export())

    def loads(self, path: str | os.PathLike[str]) -> None:
        """Restore a buffer saved with :meth:`dumps`; the components must be of the same types.

        Everything is read and checked before the buffer changes: a missing, corrupted or
        mismatched checkpoint raises :class:`~tdreplay.core.checkpoint.CheckpointError` and
        leaves the buffer exactly as it was. Updates submitted before are done first (see
        :meth:`load_state_dict`). A Ctrl-C while the checked state is installed is held back
        until the install is complete; a part that raises while installing leaves a buffer
        that refuses to be saved (``dumps`` / ``state_dict`` raise ``RuntimeError``) until a
        restore succeeds or :meth:`~tdreplay.core.ReplayBuffer.empty` (the same holds for
        :meth:`load_state_dict`).
        """
        self._await_submitted_updates()
        with self._prefetcher.held(settle=False), self._lock, \
                open_checkpoint(Path(path)) as snap:
            meta = read_json(snap / "buffer.json")
            commits = []
            for name, component in self._components().items():
                saved = meta.get(name)
                if saved != type(component).__name__:
                    raise CheckpointError(
                        f"checkpoint {name} is a {saved}, but this buffer's {name} is a "
                        f"{type(component).__name__} ({str(snap / 'buffer.json')!r})."
                    )
                commits.append(component.prepare_load(snap / name))
            if "last_written_row" in meta:  # (older checkpoints: the writer's cursor tells it)
                newest = self._saved_newest_row(
                    meta["last_written_row"], f"{str(snap / 'buffer.json')!r} last_written_row",
                    CheckpointError)
                commits.append(lambda: self._set_newest_row(newest))
            if self._stateful:
                commits.append(self._stateful.prepare_load(snap / "stateful",
                                                           list(meta.get("stateful", []))))
            commits.append(prepare_transform_load(self._transform, snap))
            rng_state = self._read_rng_state(snap / "rng.pt")
            prefetched = self._read_prefetch_state(snap)
            self.clear_prefetch()
            if rng_state is not None:
                rng = self._generator_to_restore()
                commits.append(lambda: self._restore_generator(rng, rng_state))
            commits.append(lambda: self._prefetcher.restore(prefetched))
            self._install(commits)

    def _saved_newest_row(self, row: Any, name: str,
                          error: type[Exception] = ValueError) -> int | None:
        """``row``, a saved :attr:`~tdreplay.core.Storage.last_written_row` named ``name`` in
        errors: ``None`` or a row of this buffer's storage (the rule of the storage's own
        checkpoints, :func:`~tdreplay.core.storage_checkpointer.checked_seam`)."""
        return checked_seam(row, self._storage.rows_capacity, name, error)

    def _set_newest_row(self, row: int | None) -> None:
        self._storage.last_written_row = row

    def _install(self, steps: list[Callable[[], Any]]) -> None:
        """Install a checked restore: the steps in order, a Ctrl-C held back until they are
        done, and a step that raises recorded so the half-restored buffer is not saved
        (:mod:`~tdreplay.core._installing`)."""
        if self._install_record is None:
            self._install_record = InstallRecord()
        with self._replacing_rows_itself():  # (the storage tells the others: buffer_readers)
            self._install_record.install(steps)
        self._followed_own_reset()

    def check_saveable(self) -> None:
        """Raise ``RuntimeError`` when this buffer must not be saved: its last restore
        (``loads`` / ``load_state_dict``) failed while installing, so it holds part of the
        restored state and part of its old one. ``dumps`` and ``state_dict`` call it first; a
        buffer made of others (an ensemble) checks each of them too. A restore that succeeds,
        or ``empty()``, makes the buffer saveable again.

        Examples
        --------
        >>> from tdreplay.core import ListStorage, ReplayBuffer
        >>> ReplayBuffer(storage=ListStorage(4)).check_saveable()  # nothing to say
        """
        if self._install_record is not None:
            self._install_record.check_saveable()

    def _read_prefetch_state(self, snapshot: Path) -> dict[str, Any] | None:
        """The batches drawn ahead saved in ``snapshot`` (``None`` when none were), checked
        against this buffer's ``prefetch`` before anything changes."""
        state = load_prefetched(snapshot)
        self._prefetcher.check_state(state, self._storage.max_size)
        return state

    def _generator_to_restore(self) -> torch.Generator:
        """The generator a saved generator state goes to: this buffer's, or a new CPU one
        (installed with the restore, as TorchRL's) when it has none."""
        return self._rng if self._rng is not None else torch.Generator()

    def _restore_generator(self, rng: torch.Generator, state: torch.Tensor) -> None:
        rng.set_state(state)
        if rng is not self._rng:
            self.set_rng(rng)

    def _read_rng_state(self, path: Path) -> torch.Tensor | None:
        """The generator state saved at ``path`` (``None`` when none was saved), checked
        against this buffer's generator before anything changes."""
        if not path.is_file():
            return None
        state = load_torch_file(path)
        try:
            if not isinstance(state, torch.Tensor):
                raise TypeError(f"a {type(state).__name__}, not a tensor")
            torch.Generator(device=self._generator_to_restore().device).set_state(state)
        except (TypeError, RuntimeError, ValueError) as err:
            raise CheckpointError(f"checkpoint file {str(path)!r} does not hold a generator "
                                  f"state: {err}") from err
        return state

    save = dumps
    dump = dumps
    load = loads
