"""The :class:`Writer` contract and the default :class:`RoundRobinWriter`."""

from __future__ import annotations

import abc
from typing import Any

import numpy as np
import torch

from ._stateful import StateDictCheckpointMixin
from .generations import SlotGenerations, after_stamps_of, check_generation_table
from .process_sharing import SpawnChecked
from .storage import Storage
from .utils import (
    check_flag,
    check_state_counter,
    leading_dim,
    restore_attributes,
    slice_leading,
)
from .writer_chosen_rows import ChosenRowWrites, index_tensor


class Writer(SpawnChecked, StateDictCheckpointMixin, abc.ABC):
    """Decides which rows of the storage new data goes to, and writes it.

    Contract:

    - ``add(item) -> row`` and ``extend(batch) -> rows`` (int64 tensor) write through
      ``storage.set`` and return the rows written. The storage validates the data before
      anything changes; a writer updates its own state (cursor, counts) only after the
      storage accepted the write, so a rejected write leaves everything as it was.
    - ``write_count``: items written since creation (or since ``empty(empty_write_count=True)``).
    - ``state_dict`` / ``load_state_dict`` / ``dumps`` / ``loads``.
    - ``tracks_generations`` / ``generations_of(index)`` / ``sample_info(index)``: write
      generations of the storage's rows (:mod:`tdreplay.core.generations`); the base tracks
      none and reports ``-1`` everywhere.

    Every writer accepts TorchRL's ``compilable`` keyword (a bool, kept as :attr:`compilable`).
    The rows written are the same with either value. With ``compilable=True`` a
    :class:`RoundRobinWriter` keeps its cursor in a 0-dim tensor of its own and writes at rows
    computed with tensor ops, so that a ``torch.compile``'d ``extend`` does not recompile at
    each new cursor; otherwise writers keep their counters in the writer (or, for a storage
    shared between processes, in the storage's shared memory).

    Examples
    --------
    A writer implements ``add`` and ``extend``, writing through ``self.storage``:

    >>> from tdreplay.core import ListStorage, ReplayBuffer
    >>> class FirstRows(Writer):   # every write starts again at row 0
    ...     def add(self, data):
    ...         self.storage.set(0, data)
    ...         self.write_count += 1
    ...         return 0
    ...     def extend(self, data):
    ...         rows = torch.arange(len(data))
    ...         self.storage.set(rows, data)
    ...         self.write_count += len(data)
    ...         return rows
    >>> rb = ReplayBuffer(storage=ListStorage(4), writer=FirstRows())
    >>> _ = rb.extend(["a", "b"])
    >>> _ = rb.add("c")
    >>> rb[:], rb.write_count
    (['c', 'b'], 3)
    """

    def __init__(self, compilable: bool = False) -> None:
        #: TorchRL's ``compilable`` flag; no effect in tdreplay (see the class docstring)
        self.compilable = check_flag(compilable, "compilable")
        self._storage: Storage | None = None
        # [cursor, write_count]: in this object (a list of two ints: indexing it costs a
        # fraction of a numpy array's, on every write), or in memory shared between processes
        # when the storage offers it (an int64 array, see register_storage)
        self._own_counters: Any = [0, 0]
        self._counters: Any = self._own_counters

    #: Whether this writer stamps the storage's rows with write generations (what
    #: :meth:`generations_of` reports and ``sample`` adds as ``"index_generation"``).
    tracks_generations: bool = False

    #: Entries :meth:`sample_info` adds to a sample (bookkeeping, never stored as data).
    info_keys: tuple[str, ...] = ()

    #: After an ``extend`` that wrote only some rows of its batch (a writer that keeps the
    #: best rows): the batch position of each row written, in the order of the rows returned;
    #: ``None`` (the default) when every row of the batch was written, in order. A buffer
    #: matches the batch's ``index`` and priorities to the rows written with it.
    written_positions: torch.Tensor | None = None

    #: The rows of a write that an exception (an interrupt: ``KeyboardInterrupt``, or what a
    #: signal handler raises) cut short and this writer completed before it propagated;
    #: ``None`` when there was none. The buffer takes them (setting it back to ``None``) to
    #: tell its sampler of the rows. Writers that do not complete such writes leave it.
    interrupted_rows: torch.Tensor | int | None = None

    #: Whether :meth:`write_at` and :meth:`extend_reusing` write at rows chosen by the caller
    #: (``False`` by default; :class:`RoundRobinWriter` does). A buffer whose sampler consumes
    #: items (:attr:`Sampler.max_sample_count`) refuses a writer that cannot.
    supports_write_at: bool = False

    #: False for writers whose state lives in one process's memory (e.g.
    #: ``TensorDictMaxValueWriter``'s heap of ranks): a buffer holding one refuses ``share()``
    #: and being sent to another process, and the writer itself refuses being pickled for a
    #: process being started, with :class:`~tdreplay.core.NotShareableError` (a copy's writes
    #: would diverge from the original's; :meth:`check_shareable`). Writers that keep only
    #: their counters, which live in the storage's shared memory when it offers it
    #: (:meth:`register_storage`), are shareable.
    shareable: bool = True
    not_shareable_message = (
        "Writers of type {cls} cannot be shared between processes: their state (which rows to "
        "write next) lives in one process, so the writes of another process would diverge from "
        "it. Write from one process, or use a writer that keeps only counters (RoundRobinWriter, "
        "TensorDictRoundRobinWriter).")

    def register_storage(self, storage: Storage) -> None:
        """Attach the storage this writer fills.

        A storage shared between processes (e.g. ``LazyMemmapStorage``) returns an int64 array
        ``[cursor, write_count]`` in shared memory from ``shared_writer_counters()``. The writer
        then keeps its cursor and write count there, so every process writing through the same
        storage continues from the same position.
        """
        self._storage = storage
        shared = storage.shared_writer_counters()
        self._counters = shared if shared is not None else self._own_counters

    def rows_replaced(self, storage: Storage) -> None:
        """Every row of ``storage`` (this writer's) was replaced past this writer: emptied or
        restored on the storage itself (``rb.storage.loads(path)``) or through another buffer
        reading it. The buffer calls this at once, under its lock; the writer's state about
        the old rows must follow the new ones. The base attaches the storage again
        (:meth:`register_storage`); writers that keep more (a cursor, the ranks of the rows
        they keep) override it.

        Examples
        --------
        >>> from tdreplay.core import ListStorage
        >>> storage = ListStorage(4)
        >>> writer = RoundRobinWriter()
        >>> writer.register_storage(storage)
        >>> _ = writer.extend([1, 2, 3])
        >>> storage.empty()                # past the writer
        >>> writer.rows_replaced(storage)  # (what a buffer of the storage calls)
        >>> writer.cursor
        0
        """
        self.register_storage(storage)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        if state["_counters"] is not state["_own_counters"]:
            # shared counters are re-attached from the storage after unpickling
            state["_counters"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        restore_attributes(self, state)
        if self._counters is None:
            self._counters = _LazyCounters(self.storage)

    @property
    def storage(self) -> Storage:
        """The storage this writer writes to (``RuntimeError`` before ``register_storage``)."""
        if self._storage is None:
            raise RuntimeError(f"{type(self).__name__} has no storage: register_storage() first.")
        return self._storage

    @abc.abstractmethod
    def add(self, data: Any) -> int | torch.Tensor | None:
        """Write one item; return its row (``None``, or an empty tensor, for an item the
        writer does not keep: the buffer's ``add`` then returns ``None``, as TorchRL's)."""

    @abc.abstractmethod
    def extend(self, data: Any) -> torch.Tensor:
        """Write a batch; return the rows written."""

    def write_at(self, index: Any, data: Any) -> int | torch.Tensor:
        """Write ``data`` at rows ``index`` (an int: one item; else a batch, one row per item)
        without moving the cursor; returns the rows. Writers that support it
        (:attr:`supports_write_at`) override this; the base raises ``NotImplementedError``.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot write at chosen rows "
                                  "(supports_write_at is False).")

    def extend_reusing(self, rows: Any, data: Any) -> torch.Tensor:
        """Write a batch whose first items go into ``rows`` (slots freed by a consuming
        sampler, :meth:`Sampler.reusable_slots`) and the rest where :meth:`extend` would put
        them; returns the rows written, one per item.

        With no ``rows`` this is :meth:`extend`; otherwise writers that support it
        (:attr:`supports_write_at`) override this and the base raises ``NotImplementedError``.
        """
        if torch.as_tensor(rows).numel() == 0:
            return self.extend(data)
        raise NotImplementedError(f"{type(self).__name__} cannot write at chosen rows "
                                  "(supports_write_at is False).")

    @property
    def write_count(self) -> int:
        """Number of items written so far (settable: writers count what they wrote)."""
        return int(self._counters[1])

    @write_count.setter
    def write_count(self, value: int) -> None:
        self._counters[1] = int(value)

    def generations_of(self, index: Any) -> torch.Tensor:
        """The write generation of the rows holding ``index`` (slots, as ``extend`` and
        ``sample`` return them, of any shape; or a tuple of coordinates, whose first names the
        row): int64, shaped like ``index`` (like its first component for a tuple).

        A row's stamp advances once per write, so comparing a stamp captured at sampling time
        with the current one tells whether the row still holds what was sampled. ``-1`` means
        no usable stamp: a row never written, or a writer that does not track generations
        (the base, and any writer built with ``track_generations=False``).

        Examples
        --------
        >>> from tdreplay.core import ListStorage
        >>> w = RoundRobinWriter()
        >>> w.register_storage(ListStorage(4))
        >>> w.generations_of(torch.arange(3)).tolist()
        [-1, -1, -1]
        """
        index = index_tensor(index)
        return torch.full(index.shape, -1, dtype=torch.int64, device=index.device)

    def sample_info(self, index: torch.Tensor) -> dict[str, torch.Tensor]:
        """Entries a sample at ``index`` carries besides it (``{}`` unless the writer tracks
        generations: then ``{"index_generation": generations_of(index)}``)."""
        if not self.tracks_generations:
            return {}
        return {"index_generation": self.generations_of(index)}

    def check_empty(self) -> None:
        """Raise unless the buffer may be emptied (``ReplayBuffer.empty`` asks before anything
        changes); the base allows it. ``ImmutableDatasetWriter`` refuses (``RuntimeError``),
        as TorchRL's.

        Examples
        --------
        >>> RoundRobinWriter().check_empty()  # nothing to refuse
        """

    def check_edit(self) -> None:
        """Raise unless the stored items may be changed in place (``rb[i] = x``, ``set_``,
        ``set_at_``, ``update_``, ``write_all``: the buffer asks before anything changes); the
        base allows it. ``ImmutableDatasetWriter`` refuses (``RuntimeError``).

        Examples
        --------
        >>> RoundRobinWriter().check_edit()  # nothing to refuse
        """

    def empty(self, empty_write_count: bool = True) -> None:
        """Forget the write position (and the write count when ``empty_write_count``).

        The storage's write generations (if any) advance: handles taken before are stale.
        """
        check_flag(empty_write_count, "empty_write_count")
        if empty_write_count:
            self.write_count = 0
        gens = self._storage.slot_generations if self._storage is not None else None
        if gens is not None:
            gens.invalidate()

    def state_dict(self) -> dict[str, Any]:
        """The writer's state: ``{"write_count": int}`` here; writers with a cursor or other
        counters add them (what the buffer's ``state_dict`` / ``dumps`` save)."""
        return {"write_count": self.write_count}

    def check_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Refuse a ``state_dict`` with other keys or a ``write_count`` that is not an int
        >= 0 (``ValueError`` naming the field); changes nothing."""
        super().check_state_dict(state_dict)
        if "write_count" in state_dict:
            check_state_counter(state_dict["write_count"], "write_count", type(self).__name__)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`, checked whole first (:meth:`check_state_dict`): a
        refused one changes nothing."""
        self.check_state_dict(state_dict)
        self.write_count = int(state_dict["write_count"])

    def prepare_assignment(self, value: Any, slots: torch.Tensor) -> Any:
        """What an index assignment (``rb[index] = value``) writes at storage ``slots``
        (flat, one per slot the value covers): ``value`` itself by default. A writer that
        stores entries of its own in each row (``TensorDictRoundRobinWriter``'s ``"index"``)
        returns a copy that carries them for those slots.

        Examples
        --------
        >>> RoundRobinWriter().prepare_assignment([7], torch.tensor([2]))
        [7]
        """
        return value

    def rows_appended(self, first: int, count: int) -> None:
        """The storage grew by ``count`` rows from row ``first`` through an index assignment
        past its written rows (``rb[a:b] = x``, ``write_all``), not through this writer. The
        base does nothing; a round-robin writer whose cursor stood at ``first`` moves past
        them, so that its next write does not overwrite them while the storage has free rows
        (:attr:`write_count` counts the rows of ``add`` and ``extend`` only, as before).

        Examples
        --------
        >>> from tdreplay.core import ListStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=ListStorage(8))
        >>> _ = rb.extend([0, 1])
        >>> rb[2:4] = [2, 3]  # two rows appended: the writer goes on after them
        >>> rb.writer.cursor, rb.write_count, rb.extend([4]).tolist()
        (4, 2, [4])
        """

    def check_saved_rows(self, state_dict: dict[str, Any], rows: int) -> None:
        """Raise ``ValueError`` unless ``state_dict`` (accepted by :meth:`check_state_dict`)
        can go on writing into a storage restored with ``rows`` written rows; changes
        nothing. The base accepts any; a round-robin writer refuses a cursor past the rows of
        a storage that is not full (its next write would leave a gap).

        Examples
        --------
        >>> from tdreplay.core import ListStorage
        >>> w = RoundRobinWriter()
        >>> w.register_storage(ListStorage(4))
        >>> w.check_saved_rows({"cursor": 3, "write_count": 3}, rows=2)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: RoundRobinWriter state_dict['cursor'] is 3 but the storage state holds 2 ...
        """

    def __repr__(self) -> str:
        return f"{type(self).__name__}(write_count={self.write_count})"


class RoundRobinWriter(ChosenRowWrites, Writer):
    """Writes at a cursor that wraps around when the storage is full (FIFO replacement).

    An ``extend`` larger than the capacity keeps the last ``capacity`` items; the returned rows
    still list one row per item (``(cursor + i) % capacity``).

    Examples
    --------
    >>> from tdreplay.core import ListStorage
    >>> w = RoundRobinWriter()
    >>> w.register_storage(ListStorage(3))
    >>> w.extend([1, 2]).tolist(), w.extend([3, 4]).tolist(), w.write_count
    ([0, 1], [2, 0], 4)

    With ``track_generations=True`` (as TorchRL) it stamps every row of the storage with a
    generation that advances each time the row is written (:meth:`generations_of`); samples
    then carry ``"index_generation"``, and
    :meth:`~tdreplay.core.ReplayBuffer.update_if_present` patches only rows still holding what
    was sampled. The stamps live on the storage (:attr:`Storage.slot_generations`) and are
    part of this writer's ``state_dict`` / ``dumps``. Opt-in: one int64 per row.

    >>> from tdreplay.core import ReplayBuffer
    >>> rb = ReplayBuffer(storage=ListStorage(4), writer=RoundRobinWriter(track_generations=True))
    >>> index = rb.extend([torch.tensor(i) for i in range(4)])
    >>> rb.writer.generations_of(index).tolist()
    [0, 0, 0, 0]
    >>> _ = rb.extend([torch.tensor(4), torch.tensor(5)])  # overwrites rows 0 and 1
    >>> rb.writer.generations_of(index).tolist()
    [1, 1, 0, 0]
    """

    _cursor_tensor: torch.Tensor | None = None  # set per instance when compilable
    _own_cursor_tensor: torch.Tensor | None = None  # (the one it uses unless shared)

    def __init__(self, compilable: bool = False, *, track_generations: bool = False) -> None:
        super().__init__(compilable=compilable)
        self._track_generations = check_flag(track_generations, "track_generations")
        # compilable=True: the cursor lives in a 0-dim tensor (see _extend_compiled)
        self._cursor_tensor = torch.zeros((), dtype=torch.long) if self.compilable else None
        self._own_cursor_tensor = self._cursor_tensor
        # a restored table waiting for a storage (load_state_dict before register_storage)
        self._pending_generations: torch.Tensor | None = None

    @property
    def tracks_generations(self) -> bool:  # type: ignore[override]
        """Whether this writer was built with ``track_generations=True``."""
        return self._track_generations

    @property
    def info_keys(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("index_generation",) if self._track_generations else ()

    def register_storage(self, storage: Storage) -> None:
        """Attach ``storage``; a cursor past its written rows moves back to their end.

        That happens when a used writer gets a fresh or smaller storage (``set_storage``,
        ``set_writer``): writing at the old cursor would leave unwritten rows in between.
        A new writer (nothing written, cursor ``0``), or a used one given another storage,
        on a storage that holds rows (restored alone, ``storage.loads(path)``, or filled by
        another buffer) goes on after its newest row
        (:attr:`~tdreplay.core.Storage.last_written_row`; a new writer after its written rows
        when the storage does not know it), so that its first writes replace the oldest rows,
        not the newest (TorchRL's writer starts at row 0, or keeps its cursor).

        Examples
        --------
        >>> from tdreplay.core import ListStorage
        >>> storage = ListStorage(4)
        >>> storage.set(range(4), ["a", "b", "c", "d"])
        >>> storage.set(0, "e")  # the ring's newest row is 0
        >>> writer = RoundRobinWriter()
        >>> writer.register_storage(storage)
        >>> writer.cursor
        1

        A ``compilable=True`` writer keeps its cursor in a tensor of its own, except on a
        storage whose counters are shared between processes (``shared_writer_counters()``):
        there it keeps it with them, as every writer does, so that the buffers and processes
        writing to that storage never write over each other's rows.
        """
        previous = self._storage
        super().register_storage(storage)
        shared = self._counters is not self._own_counters
        self._cursor_tensor = None if shared else self._own_cursor_tensor
        written = storage.rows_written
        newest, capacity = storage.last_written_row, storage.rows_capacity
        fresh = self.cursor == 0 and self.write_count == 0  # (or shared counters unused)
        # a storage new to a used writer: its cursor from the other storage means nothing
        # here (shared counters written through are the storage's own)
        moved = newest is not None and storage is not previous and not shared
        if written and capacity and (fresh or moved):  # after the storage's newest row
            self.cursor = (newest + 1 if newest is not None else written) % capacity
        elif self.cursor > written:
            self.cursor = written
        pending, self._pending_generations = self._pending_generations, None
        # a storage shared with another buffer carries the live stamps and wins; attached
        # again to the same storage (restored past the buffer: its stamps were dropped), the
        # table comes with the next write (a new one here would shift the stamps a writer
        # state loaded next brings)
        if storage.slot_generations is None and (pending is not None or (
                self._track_generations and storage is not previous)):
            storage.slot_generations = SlotGenerations(pending)

    def rows_replaced(self, storage: Storage) -> None:
        """The rows of ``storage`` were replaced past this writer (see
        :meth:`Writer.rows_replaced`): the cursor goes on after the storage's newest row
        (:attr:`~tdreplay.core.Storage.last_written_row`), as for a new writer, so that the next
        writes replace the oldest of the restored rows, not the row the cursor reached among
        the old ones (TorchRL's writer keeps its cursor). Counters shared between processes
        are the storage's own, restored with it.

        Examples
        --------
        >>> from tdreplay.core import ListStorage
        >>> storage = ListStorage(4)
        >>> writer = RoundRobinWriter()
        >>> writer.register_storage(storage)
        >>> _ = writer.extend([1, 2, 3])   # cursor 3
        >>> restored = ListStorage(4)
        >>> restored.set(range(4), ["a", "b", "c", "d"])
        >>> restored.set(0, "e")           # a full ring whose newest row is 0
        >>> storage.load_state_dict(restored.state_dict())
        >>> writer.rows_replaced(storage)
        >>> writer.cursor                  # the oldest row, "b"
        1
        """
        self.register_storage(storage)
        newest, capacity = storage.last_written_row, storage.rows_capacity
        if self._counters is self._own_counters and storage.rows_written and capacity \
                and newest is not None:
            self.cursor = (newest + 1) % capacity

    def _bump_generations(self, storage: Storage, rows: torch.Tensor | int, capacity: int
                          ) -> None:
        """Advance the stamps of ``rows`` (every row written, repeats included) in ``storage``
        (this writer's, as the caller read it): always when tracking, and when another writer
        of the storage tracks (its table exists)."""
        if storage.slot_generations is None:
            if not self._track_generations:
                return
            storage.slot_generations = SlotGenerations()
        storage.slot_generations.bump(torch.as_tensor(rows, dtype=torch.long), capacity)

    def generations_of(self, index: Any) -> torch.Tensor:
        if not self._track_generations:
            return super().generations_of(index)
        coordinates = isinstance(index, tuple)  # (its first component names the row)
        index = index_tensor(index)
        gens = self._storage.slot_generations if self._storage is not None else None
        if gens is None:
            return torch.full(index.shape, -1, dtype=torch.int64, device=index.device)
        numel = self.storage.row_numel
        rows = index if coordinates or numel == 1 else \
            torch.div(index, numel, rounding_mode="floor")
        return torch.where(index >= 0, gens.of(rows), torch.full_like(index, -1))

    supports_write_at = True

    def prepare_write(self, data: Any, cursor: int | torch.Tensor, capacity: int,
                      batched: bool) -> Any:
        """What is written: ``data`` itself; a subclass may return a changed copy (the
        extension hook of round-robin writers: ``TensorDictRoundRobinWriter`` stamps each row
        with its slots).

        Called by :meth:`add` / :meth:`extend` with the row the write starts at (by
        :meth:`write_at`, and by :meth:`extend` of a ``compilable=True`` writer, with the rows
        written, a tensor) and the storage's capacity in rows, once they are known and before
        anything is written; ``batched``: whether ``data`` is a batch (``extend``) or one item
        (``add``).

        Examples
        --------
        >>> from tdreplay.core import ListStorage, ReplayBuffer
        >>> class Doubling(RoundRobinWriter):
        ...     def prepare_write(self, data, cursor, capacity, batched):
        ...         return [2 * x for x in data] if batched else 2 * data
        >>> rb = ReplayBuffer(storage=ListStorage(4), writer=Doubling())
        >>> _ = rb.extend([1, 2]); _ = rb.add(5)
        >>> rb[:]
        [2, 4, 10]
        """
        return data

    @staticmethod
    def _next_row(storage: Storage, capacity: int, cursor: int) -> int:
        """The row the next write starts at: after the storage's written rows while it has
        free ones, else the cursor's. They are one row but where the storage changed past
        this writer (emptied, restored with more or fewer rows, filled by another writer or
        buffer): going on at the cursor would overwrite rows while free ones are left, or
        count rows the change removed as written again, with their old contents."""
        written = storage.rows_written
        return written if written < capacity else cursor % capacity

    def add(self, data: Any) -> int:
        storage = self.storage
        capacity = storage.rows_capacity_for(data, batched=False)
        row = self._next_row(storage, capacity, self.cursor)
        data = self.prepare_write(data, row, capacity, batched=False)
        counted = self._counters[1]
        try:  # (no cost unless raised)
            storage.set(row, data)
            self._bump_generations(storage, row, capacity)
            self._advance((row + 1) % capacity, 1)  # the count moves last
        except BaseException:
            self._complete_write(row, data, row, counted, (row + 1) % capacity)
            raise
        return row

    def extend(self, data: Any) -> torch.Tensor:
        if self._cursor_tensor is not None:
            return self._extend_compiled(data, self._cursor_tensor)
        storage = self.storage
        n = leading_dim(data)
        if n == 0:  # (before the capacity: an unwritten lazy storage cannot lay out [])
            return torch.empty(0, dtype=torch.long)
        capacity = storage.rows_capacity_for(data, batched=True)
        # (the cursor: no tensor of its own here)
        cursor = self._next_row(storage, capacity, int(self._counters[0]))
        data = self.prepare_write(data, cursor, capacity, batched=True)
        where: Any
        if cursor + n <= capacity:
            where = slice(cursor, cursor + n)
            # (torch.arange made by numpy: 1-2 us less a call)
            rows = torch.from_numpy(np.arange(cursor, cursor + n, dtype=np.int64))
        else:
            rows = where = torch.arange(cursor, cursor + n) % capacity
            if n > capacity:
                where, data = rows[-capacity:], slice_leading(data, slice(n - capacity, n))
        counted = self._counters[1]
        try:  # (no cost unless raised)
            storage.set(where, data)
            self._bump_generations(storage, rows, capacity)
            self._advance((cursor + n) % capacity, n)  # the count moves last
        except BaseException:
            self._complete_write(where, data, rows, counted, (cursor + n) % capacity)
            raise
        return rows

    def rows_appended(self, first: int, count: int) -> None:
        storage = self._storage
        capacity = storage.rows_capacity if storage is not None else None
        if not capacity or not count or self.cursor != first:
            return
        self._advance((first + count) % capacity, 0)

    def _complete_write(self, where: Any, data: Any, rows: torch.Tensor | int, counted: int,
                        cursor: int | torch.Tensor) -> None:
        """Finish the write of ``data`` at ``where`` (the storage rows ``rows``) that an
        exception cut short, before it propagates: an interrupt (``KeyboardInterrupt``, or what
        a signal handler raises) lands wherever the interpreter is, between the copies of two
        leaves (the old rows of a full storage left half overwritten) or before the storage's
        count, the cursor or this writer's count moved. The rows are written again whole
        (``storage.set`` of the same rows and data leaves the same state however far the
        first one got) and counted, the cursor moved to ``cursor``; :attr:`interrupted_rows`
        then holds them, for the buffer to tell its sampler. A write the storage refuses again
        (the exception raised was that refusal, made before anything was written) stays
        unwritten. ``counted``: the write count before the write (it moves last: once it
        moved, the write was complete)."""
        if self._counters[1] == counted:
            storage = self.storage
            try:
                storage.set(where, data)
            except Exception:  # refused: nothing was written
                return
            capacity = storage.rows_capacity
            assert capacity is not None  # (set: laid out)
            self._bump_generations(storage, rows, capacity)  # (twice if it was done: stale
            # either way)
            self._advance(cursor, torch.as_tensor(rows).numel())
        self.interrupted_rows = rows

    def _advance(self, cursor: int | torch.Tensor, written: int) -> None:
        """Move the cursor to ``cursor`` (in its tensor for a ``compilable=True`` writer) and
        count ``written`` more items, in one pass (not through the two properties: the hot path
        of ``add`` and ``extend``)."""
        counters = self._counters
        tensor = self._cursor_tensor
        if tensor is None:
            counters[0] = cursor
        else:
            tensor.fill_(cursor)
        counters[1] += written

    def _extend_compiled(self, data: Any, cursor: torch.Tensor) -> torch.Tensor:
        """:meth:`extend` of a ``compilable=True`` writer: the rows are computed from the
        cursor tensor with tensor ops and written as a tensor of rows (never a slice of ints),
        so that ``torch.compile`` does not specialize on the cursor. Same rows as
        :meth:`extend`."""
        storage = self.storage
        n = leading_dim(data)
        capacity = storage.rows_capacity_for(data, batched=True)
        if n == 0:
            return torch.empty(0, dtype=torch.long)
        rows = where = (cursor + torch.arange(n)) % capacity
        data = self.prepare_write(data, rows, capacity, batched=True)
        if n > capacity:
            where, data = rows[-capacity:], slice_leading(data, slice(n - capacity, n))
        after = (cursor + n) % capacity
        counted = self._counters[1]
        try:  # (no cost unless raised)
            storage.set(where, data)
            self._bump_generations(storage, rows, capacity)
            cursor.copy_(after)
            self._counters[1] += n  # the count moves last
        except BaseException:
            self._complete_write(where, data, rows, counted, after)
            raise
        return rows

    @property
    def cursor(self) -> int:
        """Next row to be written (settable).

        A writer built with ``compilable=True`` keeps it in a 0-dim tensor of its own (not in
        a storage's shared counters): ``torch.compile`` then traces writes without
        specializing on it.

        Examples
        --------
        >>> from tdreplay.core import ListStorage
        >>> w = RoundRobinWriter(compilable=True)
        >>> w.register_storage(ListStorage(3))
        >>> w.extend(["a", "b"]).tolist(), w.cursor
        ([0, 1], 2)
        """
        tensor = self._cursor_tensor
        return int(self._counters[0]) if tensor is None else int(tensor)

    @cursor.setter
    def cursor(self, value: int) -> None:
        tensor = self._cursor_tensor
        if tensor is None:
            self._counters[0] = int(value)
        else:
            tensor.fill_(value)

    def empty(self, empty_write_count: bool = True) -> None:
        super().empty(empty_write_count)
        self.cursor = 0

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"cursor": self.cursor, "write_count": self.write_count}
        if self._track_generations:
            gens = self._storage.slot_generations if self._storage is not None else None
            state["generation"] = (gens.table if gens is not None
                                   else self._pending_generations)
            if state["generation"] is None:
                del state["generation"]
        return state

    def check_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Refuse a ``state_dict`` whose ``cursor`` is not in ``[0, capacity)`` of the
        registered storage (or whose ``write_count`` is negative, or whose ``generation``
        table is not a 1-D int64 tensor of stamps >= -1 at most ``capacity`` long):
        ``ValueError`` naming the field, nothing changed. A state without ``generation`` (not
        tracked, or saved before the first write) loads into any writer.

        Examples
        --------
        >>> from tdreplay.core import ListStorage
        >>> w = RoundRobinWriter()
        >>> w.register_storage(ListStorage(4))
        >>> w.check_state_dict({"cursor": 999, "write_count": 3})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: RoundRobinWriter state_dict['cursor'] is 999, outside [0, 4): ...
        """
        owner = type(self).__name__
        expected = {"cursor", "write_count"}
        if not expected <= set(state_dict) or not set(state_dict) <= expected | {"generation"}:
            raise ValueError(f"{owner} state_dict keys differ: expected {sorted(expected)} "
                             f"(and 'generation' when tracked), got {sorted(state_dict)}.")
        check_state_counter(state_dict["write_count"], "write_count", owner)
        cursor = check_state_counter(state_dict["cursor"], "cursor", owner)
        capacity = self._storage.rows_capacity if self._storage is not None else None
        if capacity is not None and cursor >= capacity:
            raise ValueError(f"{owner} state_dict['cursor'] is {cursor}, outside "
                             f"[0, {capacity}): the storage holds {capacity} rows.")
        if "generation" in state_dict:
            check_generation_table(state_dict["generation"], capacity, owner)

    def check_saved_rows(self, state_dict: dict[str, Any], rows: int) -> None:
        capacity = self._storage.rows_capacity if self._storage is not None else None
        cursor = int(state_dict["cursor"])
        if cursor > rows and (capacity is None or rows < capacity):
            raise ValueError(f"{type(self).__name__} state_dict['cursor'] is {cursor} but the "
                             f"storage state holds {rows} rows of {capacity}: the next write "
                             "would leave a gap.")
        table = state_dict.get("generation")
        if isinstance(table, torch.Tensor) and rows and (
                table.numel() < rows or bool((table[:rows] < 0).any())):
            # a written row without a stamp would never match a handle: updates of it skipped
            raise ValueError(f"{type(self).__name__} state_dict['generation'] does not stamp "
                             f"every written row: the storage state holds {rows} rows, the "
                             f"table covers {min(table.numel(), rows)} of them with stamps "
                             ">= 0.")

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.check_state_dict(state_dict)
        self.cursor = int(state_dict["cursor"])
        self.write_count = int(state_dict["write_count"])
        self._note_newest_row()
        if "generation" in state_dict:
            table = check_generation_table(state_dict["generation"], None, type(self).__name__)
            if self._storage is None:
                self._pending_generations = table
            else:
                current = self._storage.slot_generations
                self._storage.slot_generations = SlotGenerations(
                    table if current is None else after_stamps_of(current, table))
        elif self._storage is not None and self._storage.slot_generations is not None:
            # a state saved untracked: the restored rows are other records than the stamps
            # say, so no handle taken before matches them (as after empty)
            self._storage.slot_generations.invalidate()

    def _note_newest_row(self) -> None:
        """Tell the storage the row this writer wrote last, the ring's newest (what its writes
        record in :attr:`~tdreplay.core.Storage.last_written_row`): a restored storage does not
        know it, and the slice samplers and HER cut the ring there."""
        storage = self._storage
        capacity = storage.rows_capacity if storage is not None else None
        if storage is not None and capacity:
            written = self.write_count and len(storage)
            storage.last_written_row = (self.cursor - 1) % capacity if written else None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(cursor={self.cursor}, write_count={self.write_count})"


class _LazyCounters:
    """Shared counters of a storage, fetched on first use (the storage may still be unpickling)."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage
        self._array: Any = None

    def _get(self) -> Any:
        if self._array is None:
            self._array = self._storage.shared_writer_counters()
        return self._array

    def __getitem__(self, pos: int) -> Any:
        return self._get()[pos]

    def __setitem__(self, pos: int, value: int) -> None:
        self._get()[pos] = value
