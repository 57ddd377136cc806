"""``TensorDictMaxValueWriter``: keep the rows with the highest rank (a min-heap over rows)."""

from __future__ import annotations

import heapq
import math
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase, is_tensor_collection

from tdreplay.core import Writer
from tdreplay.core.utils import NestedKey, check_state_counter, normalize_keys, take_rows

_REDUCTIONS = ("sum", "mean", "max", "min", "median")

# A heap entry is ``(rank, row, age)``, as TorchRL's ``(rank, row)``: ``heapq`` pops the smallest
# entry, the lowest rank and, among equal ranks, the lowest row. Rows offered one after the other
# (a batch in its order) fill the free rows first (0, 1, ...); once the storage is full, a row is
# written only if its rank is strictly higher than the lowest kept, and it replaces the smallest
# entry. So on a tie between a new row and the lowest kept ones the kept rows stay, but a row of
# equal rank that filled a free row may outlive an older one that sits in a lower row (TorchRL's
# rule: both libraries keep the same rows in the same places). The age (rows offered before it)
# orders nothing; it is kept in the checkpoint format, which is unchanged.
_Entry = tuple[float, int, int]


class NotATensorCollectionError(TypeError, RuntimeError):
    """Data without a rank entry to read: not a TensorDict (or tensorclass).

    A ``TypeError``; also a ``RuntimeError``, which TorchRL's ``TensorDictMaxValueWriter`` raises
    for the same data, so that ``except RuntimeError`` written for TorchRL keeps working.

    Examples
    --------
    >>> from tdreplay.core import ListStorage
    >>> w = TensorDictMaxValueWriter()
    >>> w.register_storage(ListStorage(2))
    >>> try:
    ...     w.extend(torch.zeros(3))
    ... except RuntimeError as err:
    ...     print(type(err).__name__, isinstance(err, TypeError))
    NotATensorCollectionError True
    """


class TensorDictMaxValueWriter(Writer):
    """A writer that keeps the ``capacity`` rows with the highest rank.

    Every row offered to :meth:`extend` / :meth:`add` carries a rank, read from ``rank_key``.
    While the storage has free rows, every row is written, into the next free row. Once it is
    full, a row is written only if its rank is strictly higher than the lowest rank kept, and it
    replaces that row (of several rows with the lowest rank, the one in the lowest row, as
    TorchRL's heap of ``(rank, row)``); rows ranked at or below the current minimum are not
    written. A batch is offered row by row in its order, so the rows kept, and where, are
    TorchRL's, ties included. The ranks kept live in a min-heap
    over the storage rows, which is part of :meth:`state_dict` and of the buffer's
    ``dumps``/``loads`` checkpoints, so a restored buffer goes on keeping exactly the rows the
    original one would have kept.

    Parameters
    ----------
    rank_key : nested key, optional
        Entry holding the rank of each row. Defaults to ``("next", "reward")``, as in TorchRL.
    reduction : str
        How a rank with more than one element per row (e.g. the rewards of a ``[T]`` trajectory
        in a ``ndim=2`` storage, or a trailing ``[1]`` dimension) becomes one number: ``"sum"``
        (default), ``"mean"``, ``"max"``, ``"min"`` or ``"median"``.
    compilable : bool
        Accepted as in TorchRL; no effect (see :class:`~tdreplay.core.Writer`).

    Notes
    -----
    - :meth:`extend` returns only the rows actually written, in the order of the batch rows they
      hold (a subset of the batch, possibly empty; :attr:`written_positions` says which batch
      rows they hold). A buffer's ``extend`` turns them into TorchRL's result: one entry per
      batch row, ``-1`` for a row not kept. A batch row that would be written and then
      evicted by a better row of the same batch is not written at all (it does not count in
      :attr:`write_count`; TorchRL writes it and counts it); the other rows land where
      TorchRL's would.
    - :meth:`add` returns the row written, or an empty tensor when the item was not kept (a
      buffer's ``add`` then returns ``None``, as TorchRL's).
    - Storages of several dims are ranked row by row, with the rank reduced over the row
      (``reduction``); TorchRL refuses them. The rows are the batch's slices along the buffer's
      ``dim_extend``: with ``dim_extend=0`` a ``[B, T]`` batch offers ``B`` rows of ``T``
      steps (trajectories); with ``dim_extend=1`` (an ``ndim=2`` storage's default) it offers
      ``T`` rows, one time step of the ``B`` environments each (feed ``[T, B]`` batches to
      rank trajectories). ``extend`` returns the slots in the batch's layout, ``-1`` where
      a row was not kept.
    - ``rb[index] = value`` bypasses the writer: the heap keeps the ranks the rows had when the
      writer wrote them.
    - Rows the heap does not rank are free rows, written next whatever they hold: those of a
      storage built over data (``TensorStorage(data)``), as TorchRL's writer writes there. A
      restored buffer has the same free rows (its writer state ranks fewer rows than its
      storage state holds); a writer state that ranks more rows than the storage state holds
      is refused.
    - The writer changes its heap only after the storage accepted the write: data the storage
      rejects (wrong keys, shapes) leaves the heap, the write count and the storage unchanged.
    - Thread safety: the buffer calls the writer under its lock, so several threads may extend
      the same buffer.
    - Processes: the heap lives in this process's memory, so the writer is not
      :attr:`~tdreplay.core.Writer.shareable`: a buffer holding it refuses ``share()`` and being
      sent to (or written by) another process with
      :class:`~tdreplay.core.NotShareableError`, instead of keeping a diverging heap there.

    Examples
    --------
    >>> import torch
    >>> from tensordict import TensorDict
    >>> from tdreplay.core import ListStorage, TensorDictReplayBuffer
    >>> rb = TensorDictReplayBuffer(
    ...     storage=ListStorage(2), writer=TensorDictMaxValueWriter(rank_key="key"), batch_size=2
    ... )
    >>> td = TensorDict({"key": torch.tensor([3.0, 1.0, 2.0]), "obs": torch.arange(3)}, [3])
    >>> rb.extend(td).tolist()  # the row of each batch row; -1: not kept
    [0, -1, 1]
    >>> sorted(rb[:]["obs"].tolist())
    [0, 2]
    >>> rb.extend(TensorDict({"key": torch.tensor([0.5]), "obs": torch.tensor([9])}, [1])).tolist()
    [-1]
    >>> rb.extend(TensorDict({"key": torch.tensor([5.0]), "obs": torch.tensor([7])}, [1])).tolist()
    [1]
    >>> sorted(rb[:]["obs"].tolist())
    [0, 7]
    """

    shareable = False  # the heap of ranks lives in one process (see Notes)

    #: the leaves of the last item the storage checked and accepted without writing it (see
    #: _check_unwritten): an item of the same leaves needs no check again (a class default:
    #: set per writer by its first such check; a writer pickled by 0.5.0 has none of its own)
    _checked_item: tuple[Any, ...] | None = None

    def __init__(self, rank_key: NestedKey | None = None, reduction: str = "sum", *,
                 compilable: bool = False) -> None:
        super().__init__(compilable=compilable)
        if rank_key is None:
            rank_key = ("next", "reward")
        if not isinstance(rank_key, (str, tuple)):
            raise TypeError(f"rank_key must be a str or a tuple of str, got {rank_key!r}.")
        keys = normalize_keys(rank_key, "rank_key")
        if len(keys) != 1:
            raise TypeError(f"rank_key must be one (nested) key, got {rank_key!r}.")
        if reduction not in _REDUCTIONS:
            raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}.")
        self.rank_key: NestedKey = keys[0]
        self.reduction = reduction
        self._heap: list[_Entry] = []
        self._age = 0  # how many rows were offered so far (each gets the next age)

    # ---- ranks ------------------------------------------------------------------------------
    def _ranks(self, data: Any, batched: bool) -> torch.Tensor:
        """One float64 rank per offered row (a single element when ``batched`` is False)."""
        if not is_tensor_collection(data):
            raise NotATensorCollectionError(
                f"{type(self).__name__} expects data to be a tensor collection (a TensorDict, "
                f"whose entry {self.rank_key!r} it reads ranks from); got {type(data).__name__}."
            )
        rank = data.get(self.rank_key, None)
        if rank is None:
            raise KeyError(
                f"{type(self).__name__}: the rank entry {self.rank_key!r} is missing from the data "
                f"(set rank_key=... to the entry to rank rows by)."
            )
        if not isinstance(rank, torch.Tensor) or rank.is_complex():
            got = f"dtype {rank.dtype}" if isinstance(rank, torch.Tensor) else type(rank).__name__
            raise TypeError(f"rank entry {self.rank_key!r} must be a real-valued tensor, "
                            f"got {got}.")
        rank = rank.detach().to("cpu", torch.float64)
        if batched:
            if rank.ndim == 0:
                raise ValueError(f"rank entry {self.rank_key!r} has no batch dimension.")
            if rank.shape[0] == 0:  # an empty batch: no row to rank (nor to write)
                return rank.new_empty(0)
            rank = rank.reshape(rank.shape[0], -1)
        else:
            rank = rank.reshape(1, -1)
        if rank.shape[1] == 0:
            raise ValueError(f"rank entry {self.rank_key!r} has no element to rank a row by.")
        if rank.shape[1] > 1:
            rank = self._reduce(rank)
        else:
            rank = rank[:, 0]
        if torch.isnan(rank).any():
            raise ValueError(f"rank entry {self.rank_key!r} holds NaN: rows cannot be ranked.")
        return rank

    def _reduce(self, rank: torch.Tensor) -> torch.Tensor:
        if self.reduction == "sum":
            return rank.sum(1)
        if self.reduction == "mean":
            return rank.mean(1)
        if self.reduction == "max":
            return rank.amax(1)
        if self.reduction == "min":
            return rank.amin(1)
        return rank.median(1).values

    # ---- planning ---------------------------------------------------------------------------
    def _plan(self, rank: torch.Tensor, capacity: int
              ) -> tuple[dict[int, int], list[_Entry], list[_Entry]]:
        """Offer ``rank`` to the heap (in place); return ``{row: batch position}`` and the log.

        The log (entries pushed, entries popped) lets :meth:`_undo` restore the heap if the
        storage then rejects the write.
        """
        heap = self._heap
        if len(heap) > capacity:
            raise RuntimeError(f"the writer's heap holds {len(heap)} rows but the storage has "
                               f"{capacity}: was the storage replaced?")
        ranks = rank.tolist()
        n = len(ranks)
        base_age = self._age
        positions: list[int] | range = range(n)
        free = capacity - len(heap)
        if n > free:
            # Rows that would not be written at all are dropped before the heap loop: once the
            # storage is full, the lowest rank kept only rises, so a row at or below the lowest
            # rank kept when the storage fills up is never written. (Rows that would be written
            # and then replaced stay in the loop: they decide which rows later ones replace.)
            floor = heap[0][0] if heap else math.inf
            if free:
                floor = min(floor, min(ranks[:free]))
            if n <= _FEW_ROWS:  # (an add, a small batch: a tensor op costs more)
                positions = [i for i in range(n) if i < free or ranks[i] > floor]
            else:
                keep = rank > floor
                keep[:free] = True
                positions = keep.nonzero().squeeze(1).tolist()
        written: dict[int, int] = {}  # row -> batch position now holding it
        pushed: list[_Entry] = []
        popped: list[_Entry] = []
        for pos in positions:
            value = ranks[pos]
            if len(heap) < capacity:
                entry = (value, len(heap), base_age + pos)
                heapq.heappush(heap, entry)
            elif value > heap[0][0]:
                entry = (value, heap[0][1], base_age + pos)
                popped.append(heapq.heapreplace(heap, entry))
            else:
                continue
            pushed.append(entry)
            written[entry[1]] = pos  # (a row of this batch written there before: replaced)
        return written, pushed, popped

    def _undo(self, pushed: list[_Entry], popped: list[_Entry]) -> None:
        """Restore the heap as it was before :meth:`_plan` (only on a rejected write)."""
        pushed_set = set(pushed)
        restored = [e for e in self._heap if e not in pushed_set]
        restored += [e for e in popped if e not in pushed_set]
        heapq.heapify(restored)
        self._heap = restored

    def _fit_to_storage(self) -> None:
        """When the storage holds fewer rows than the heap ranks (emptied or restored past this
        writer: ``rb.storage.empty()``), the heap keeps only the rows it still holds, ranked
        lowest (their values are unknown to it), so that writes fill the free rows first, then
        replace those; else the rows past the storage's end were written as if still held
        (rows emptied came back) and the writer's state fit no storage state."""
        held = self.storage.rows_written
        if held < len(self._heap):
            self._heap = [(-math.inf, row, row - held) for row in range(held)]
            heapq.heapify(self._heap)

    def _write(self, data: Any, rank: torch.Tensor, capacity: int, single: bool) -> torch.Tensor:
        self._fit_to_storage()
        written, pushed, popped = self._plan(rank, capacity)
        n = rank.numel()
        counted = self.write_count
        where: Any = None
        payload: Any = None
        try:  # (no cost unless raised)
            # batch order: rows sorted by the batch position they hold
            pairs = sorted(written.items(), key=lambda rp: rp[1])
            row_list = [r for r, _ in pairs]
            positions = [p for _, p in pairs]
            every_row = positions == list(range(n))  # the whole batch kept, in order
            rows = torch.tensor(row_list, dtype=torch.long)
            if pairs:
                # a written item of other leaves may have grown the storage's entries: an item
                # of the leaves checked before is checked again
                if self._checked_item is not None and (
                        not single or _item_leaves(data) != self._checked_item):
                    self._checked_item = None
                if single:
                    where, payload = row_list[0], data
                elif every_row and row_list == list(range(row_list[0], row_list[0] + n)):
                    # the whole batch lands on consecutive rows: one block copy
                    where, payload = slice(row_list[0], row_list[0] + n), data
                else:
                    where, payload = rows, take_rows(data, torch.tensor(positions))
                self.storage.set(where, payload)
            elif n:
                self._check_unwritten(data, single)
            self.written_positions = (None if single or every_row
                                      else torch.tensor(positions, dtype=torch.long))
            self._age += n
            self.write_count = counted + len(pairs)  # the count moves last
        except BaseException:
            if not self._complete_write(where, payload, written, counted, n):
                self._undo(pushed, popped)
            raise
        return rows

    def _complete_write(self, where: Any, payload: Any, written: dict[int, int], counted: int,
                        offered: int) -> bool:
        """Finish a write that an exception cut short, before it propagates; ``False`` when
        there is nothing to finish (the heap is then put back as it was). An interrupt
        (``KeyboardInterrupt``, or what a signal handler raises) lands wherever the
        interpreter is: between the copies of two leaves (rows left half overwritten, which
        the heap ranked by the new rows) or after the storage's write, before the count moved.
        The rows are written again whole (``storage.set`` of the same rows and data leaves the
        same state however far the first one got) and counted; :attr:`interrupted_rows` holds
        them, for the buffer to tell its sampler (with every row's priority when the whole
        batch was kept, else the max priority). A write the storage refuses again (the
        exception was that refusal, made before anything was written) stays unwritten, as a
        write with no row to write (``where`` is ``None``)."""
        rows = torch.tensor(sorted(written, key=written.__getitem__), dtype=torch.long)
        if self.write_count == counted:
            if where is None:
                return False
            try:
                self.storage.set(where, payload)
            except Exception:  # refused: nothing was written
                return False
            self._age += offered
            self.write_count = counted + rows.numel()
        self.written_positions = None  # (the buffer tells the rows without their positions)
        self.interrupted_rows = rows
        return True

    def register_storage(self, storage: Any) -> None:
        """Attach ``storage`` (an item it has not checked is checked again; rows past its
        written ones are forgotten, see :meth:`_fit_to_storage`)."""
        super().register_storage(storage)
        self._checked_item = None
        self._fit_to_storage()

    def rows_replaced(self, storage: Any) -> None:
        """The rows of ``storage`` were replaced past this writer (emptied or restored on the
        storage itself, or through another buffer reading it): the heap ranks the rows the
        storage holds now, read from their ``rank_key`` entries, so that a new row replaces
        the lowest of them (the heap kept the ranks of the rows gone: a row better than every
        restored one was refused, or a worse one replaced a better). When the ranks cannot be
        read (no ``rank_key`` entry, a NaN among them), every row ranks lowest. TorchRL's
        writer keeps its heap.

        Examples
        --------
        >>> from tdreplay.core import TensorDictReplayBuffer
        >>> from tdreplay.storages import LazyTensorStorage
        >>> storage = LazyTensorStorage(2)
        >>> rb = TensorDictReplayBuffer(storage=storage,
        ...                             writer=TensorDictMaxValueWriter(rank_key="r"))
        >>> _ = rb.extend(TensorDict({"r": torch.tensor([10.0, 20.0])}, [2]))
        >>> saved = TensorDictReplayBuffer(storage=LazyTensorStorage(2))
        >>> _ = saved.extend(TensorDict({"r": torch.tensor([1.0, 2.0])}, [2]))
        >>> storage.load_state_dict(saved.storage.state_dict())  # past rb: rb is told
        >>> rb.writer.ranks.tolist()
        [1.0, 2.0]
        >>> rb.extend(TensorDict({"r": torch.tensor([5.0])}, [1])).tolist()  # replaces r=1
        [0]
        """
        super().rows_replaced(storage)
        held = storage.rows_written
        ranks = self._stored_ranks(storage, held)
        self._heap = [(rank, row, row - held) for row, rank in enumerate(ranks)]
        heapq.heapify(self._heap)

    def _stored_ranks(self, storage: Any, held: int) -> list[float]:
        """The rank of each of the first ``held`` rows of ``storage``, or ``-inf`` for all of
        them when they cannot be read."""
        if not held:
            return []
        try:
            rows = storage.get(slice(0, held))
            if isinstance(rows, list):
                rows = storage.default_collate(rows)
            ranks = self._ranks(rows, batched=True)
        except (KeyError, TypeError, ValueError, RuntimeError):
            return [-math.inf] * held
        if ranks.numel() != held:
            return [-math.inf] * held
        return ranks.tolist()

    def _check_unwritten(self, data: Any, single: bool) -> None:
        """None of ``data``'s rows ranks high enough: the storage still checks it (keys,
        shapes, dtypes) by writing none of its rows, so that whether bad data is refused does
        not depend on its ranks (nothing changes either way; an entry the storage does not
        hold yet is not checked: a row that ranks high enough adds it, or is refused by a
        storage that takes no new entries). An item of the same leaves as the
        last one it accepted so (the common refused ``add``) is not checked again: the check
        costs several times the rest of an ``add``."""
        signature = _item_leaves(data) if single else None
        if signature is not None and signature == self._checked_item:
            return
        empty = (data.unsqueeze(0) if single else data)[:0]
        stored = self.storage.get(torch.empty(0, dtype=torch.long)) if len(self.storage) else None
        known = set(stored.keys(True, True)) if isinstance(stored, TensorDictBase) else None
        if known is not None and known <= set(empty.keys(True, True)):
            # entries the storage lacks are not checked: a write of none of the rows would add
            # them to a lazy storage (TorchRL's adds none). (With an entry missing, the
            # storage refuses the whole, naming both, and adds nothing.)
            empty = empty.select(*known)
        self.storage.set(torch.empty(0, dtype=torch.long), empty, set_cursor=False)
        self._checked_item = signature

    # ---- Writer API -------------------------------------------------------------------------
    def add(self, data: TensorDictBase) -> int | None:
        """Offer one item; return its row, or ``None`` if it ranks too low to be kept (as
        TorchRL's)."""
        rank = self._ranks(data, batched=False)
        capacity = self.storage.rows_capacity_for(data, batched=False)
        rows = self._write(data, rank, capacity, single=True)
        return int(rows[0]) if rows.numel() else None

    def extend(self, data: TensorDictBase) -> torch.Tensor:
        """Offer a batch; return the rows written (a subset of the batch, in batch order)."""
        rank = self._ranks(data, batched=True)
        if not rank.numel():
            self.written_positions = None  # (no row: all of them written, in order)
            return torch.empty(0, dtype=torch.long)
        capacity = self.storage.rows_capacity_for(data, batched=True)
        return self._write(data, rank, capacity, single=False)

    def get_insert_index(self, data: TensorDictBase) -> int | None:
        """The row ``data`` (one item) would be written to, or ``None``; changes nothing."""
        rank = self._ranks(data, batched=False).item()
        capacity = self.storage.rows_capacity_for(data, batched=False)
        if len(self._heap) < capacity:
            return len(self._heap)
        return self._heap[0][1] if rank > self._heap[0][0] else None

    # ---- state ------------------------------------------------------------------------------
    @property
    def ranks(self) -> torch.Tensor:
        """Rank of each kept row, indexed by row (length = rows written so far)."""
        out = torch.empty(len(self._heap), dtype=torch.float64)
        for rank, row, _ in self._heap:
            out[row] = rank
        return out

    def empty(self, empty_write_count: bool = True) -> None:
        super().empty(empty_write_count)
        self._heap = []
        self._age = 0

    def state_dict(self) -> dict[str, Any]:
        # in row order: the state does not depend on the heap's internal order (a rejected
        # write restores the same entries, not necessarily in the same list positions)
        # (the format of earlier versions, whose heap ordered ties by age: the same entries)
        heap = sorted(self._heap, key=lambda entry: entry[1])
        return {
            "write_count": self.write_count,
            "age": self._age,
            "heap_ranks": torch.tensor([e[0] for e in heap], dtype=torch.float64),
            "heap_ages": torch.tensor([e[2] for e in heap], dtype=torch.long),
            "heap_rows": torch.tensor([e[1] for e in heap], dtype=torch.long),
        }

    def check_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().check_state_dict(state_dict)
        parts = [state_dict[k] for k in ("heap_ranks", "heap_ages", "heap_rows")]
        if not all(isinstance(p, torch.Tensor) and p.ndim == 1 for p in parts):
            raise ValueError(f"{type(self).__name__} state_dict heap entries must be 1-d tensors.")
        n = parts[0].numel()
        if any(p.numel() != n for p in parts):
            raise ValueError(f"{type(self).__name__} state_dict heap entries differ in length: "
                             f"{[p.numel() for p in parts]}.")
        rows = parts[2]
        if n and (sorted(rows.tolist()) != list(range(n))):
            raise ValueError(f"{type(self).__name__} state_dict heap rows must be 0..{n - 1} "
                             "each once.")
        if torch.isnan(parts[0]).any():
            raise ValueError(f"{type(self).__name__} state_dict heap ranks hold NaN.")
        if parts[1].is_floating_point() or parts[2].is_floating_point():
            raise ValueError(f"{type(self).__name__} state_dict heap ages and rows must be "
                             "integer tensors.")
        check_state_counter(state_dict["age"], "age", type(self).__name__)  # (write_count: base)

    def check_saved_rows(self, state_dict: dict[str, Any], rows: int) -> None:
        """``ValueError`` when the saved heap ranks more rows than the ``rows`` rows of the
        storage state restored with it (a ranked row that is not there fails the next
        ``extend``). Fewer is a storage built over data (``TensorStorage(data)``): its rows the
        heap does not rank yet are the next ones written, as before the save."""
        kept = state_dict["heap_rows"].numel()
        if kept > rows:
            raise ValueError(f"{type(self).__name__} state_dict ranks {kept} rows but the "
                             f"storage state holds {rows}: a writer state saved with another "
                             "storage state?")

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.check_state_dict(state_dict)
        heap = list(zip(state_dict["heap_ranks"].tolist(),
                        state_dict["heap_rows"].tolist(),
                        state_dict["heap_ages"].tolist()))
        # (saved in row order, by this version or an earlier one whose heap broke ties by age:
        # the entries are the same, ordered here by rank, then row)
        heapq.heapify(heap)
        self._heap = heap
        self._age = int(state_dict["age"])
        self.write_count = int(state_dict["write_count"])

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(rank_key={self.rank_key!r}, reduction={self.reduction!r}, "
                f"kept={len(self._heap)}, write_count={self.write_count})")


#: batches of at most this many rows are planned in Python, larger ones with tensor ops
_FEW_ROWS = 32


def _item_leaves(data: Any) -> tuple[Any, ...] | None:
    """``(batch size, ((key, shape, dtype, layout, device) of every leaf))`` of a plain
    TensorDict item of tensors (what a tensor storage checks of it: a meta or a sparse leaf
    differs); ``None`` for anything else (checked by the storage every time)."""
    if type(data) is not TensorDict:
        return None
    leaves = []
    for key, value in data.items(True, True):
        if type(value) is not torch.Tensor:
            return None
        leaves.append((key, value.shape, value.dtype, value.layout, value.device))
    return data.batch_size, tuple(leaves)
