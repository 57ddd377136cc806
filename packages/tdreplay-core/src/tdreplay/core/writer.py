"""The :class:`Writer` contract and the default :class:`RoundRobinWriter`."""

from __future__ import annotations

import abc
from typing import Any

import numpy as np
import torch

from ._stateful import StateDictCheckpointMixin
from .storage import Storage
from .utils import check_instance, is_int, leading_dim, slice_leading


class Writer(StateDictCheckpointMixin, abc.ABC):
    """Decides which rows of the storage new data goes to, and writes it.

    Contract:

    - ``add(item) -> row`` and ``extend(batch) -> rows`` (int64 tensor) write through
      ``storage.set`` and return the rows written. The storage validates the data before
      anything changes; a writer updates its own state (cursor, counts) only after the
      storage accepted the write, so a rejected write leaves everything as it was.
    - ``write_count``: items written since creation (or since ``empty(empty_write_count=True)``).
    - ``state_dict`` / ``load_state_dict`` / ``dumps`` / ``loads``.

    Every writer accepts TorchRL's ``compilable`` keyword (a bool, kept as :attr:`compilable`).
    It changes nothing in tdreplay: TorchRL's ``compilable=True`` keeps the cursor in a plain
    Python int instead of a ``multiprocessing`` value so that ``torch.compile`` can trace
    writes; tdreplay's writers keep their counters in the writer (or, for a storage shared
    between processes, in the storage's shared memory) either way, so the rows written are the
    same with either value.
    """

    def __init__(self, *, compilable: bool = False) -> None:
        #: TorchRL's ``compilable`` flag; no effect in tdreplay (see the class docstring)
        self.compilable = check_instance(compilable, bool, "compilable")
        self._storage: Storage | None = None
        # [cursor, write_count]: in this object, or in memory shared between processes when
        # the storage offers it (see register_storage)
        self._own_counters = np.zeros(2, dtype=np.int64)
        self._counters: Any = self._own_counters

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

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        if state["_counters"] is not state["_own_counters"]:
            # shared counters are re-attached from the storage after unpickling
            state["_counters"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self._counters is None:
            self._counters = _LazyCounters(self.storage)

    @property
    def storage(self) -> Storage:
        if self._storage is None:
            raise RuntimeError(f"{type(self).__name__} has no storage: register_storage() first.")
        return self._storage

    @abc.abstractmethod
    def add(self, data: Any) -> int | torch.Tensor:
        """Write one item; return its row."""

    @abc.abstractmethod
    def extend(self, data: Any) -> torch.Tensor:
        """Write a batch; return the rows written."""

    @property
    def write_count(self) -> int:
        """Number of items written so far (settable: writers count what they wrote)."""
        return int(self._counters[1])

    @write_count.setter
    def write_count(self, value: int) -> None:
        self._counters[1] = value

    def empty(self, empty_write_count: bool = True) -> None:
        """Forget the write position (and the write count when ``empty_write_count``)."""
        if empty_write_count:
            self.write_count = 0

    def state_dict(self) -> dict[str, Any]:
        return {"write_count": self.write_count}

    def check_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Refuse a ``state_dict`` with other keys or a ``write_count`` that is not an int
        >= 0 (``ValueError`` naming the field); changes nothing."""
        super().check_state_dict(state_dict)
        if "write_count" in state_dict:
            _check_counter(state_dict["write_count"], "write_count", type(self).__name__)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.check_state_dict(state_dict)
        self.write_count = int(state_dict["write_count"])

    def __repr__(self) -> str:
        return f"{type(self).__name__}(write_count={self.write_count})"


class RoundRobinWriter(Writer):
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
    """

    def register_storage(self, storage: Storage) -> None:
        """Attach ``storage``; a cursor past its written rows moves back to their end.

        That happens when a used writer gets a fresh or smaller storage (``set_storage``,
        ``set_writer``): writing at the old cursor would leave unwritten rows in between.
        """
        super().register_storage(storage)
        numel = storage.row_numel
        written = len(storage) // numel if numel else 0
        if self.cursor > written:
            self.cursor = written

    def _before_write(self, data: Any, cursor: int, capacity: int, batched: bool) -> Any:
        """What is written: ``data`` itself; subclasses may return a changed copy.

        Called by :meth:`add` / :meth:`extend` with the row the write starts at and the
        storage's capacity in rows, once they are known and before anything is written.
        """
        return data

    def add(self, data: Any) -> int:
        storage = self.storage
        capacity = storage.rows_capacity_for(data, batched=False)
        row = self.cursor % capacity
        storage.set(row, self._before_write(data, row, capacity, batched=False))
        self.cursor = (row + 1) % capacity
        self.write_count += 1
        return row

    def extend(self, data: Any) -> torch.Tensor:
        storage = self.storage
        n = leading_dim(data)
        capacity = storage.rows_capacity_for(data, batched=True)
        cursor = self.cursor % capacity
        if n == 0:
            return torch.empty(0, dtype=torch.long)
        data = self._before_write(data, cursor, capacity, batched=True)
        if cursor + n <= capacity:
            storage.set(slice(cursor, cursor + n), data)
            rows = torch.arange(cursor, cursor + n)
        else:
            rows = torch.arange(cursor, cursor + n) % capacity
            if n > capacity:
                storage.set(rows[-capacity:], slice_leading(data, slice(n - capacity, n)))
            else:
                storage.set(rows, data)
        self.cursor = (cursor + n) % capacity
        self.write_count += n
        return rows

    @property
    def cursor(self) -> int:
        """Next row to be written (settable)."""
        return int(self._counters[0])

    @cursor.setter
    def cursor(self, value: int) -> None:
        self._counters[0] = value

    def empty(self, empty_write_count: bool = True) -> None:
        super().empty(empty_write_count)
        self.cursor = 0

    def state_dict(self) -> dict[str, Any]:
        return {"cursor": self.cursor, "write_count": self.write_count}

    def check_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Refuse a ``state_dict`` whose ``cursor`` is not in ``[0, capacity)`` of the
        registered storage (or whose ``write_count`` is negative): ``ValueError`` naming the
        field, nothing changed.

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
        super().check_state_dict(state_dict)
        cursor = _check_counter(state_dict["cursor"], "cursor", type(self).__name__)
        capacity = self._storage.rows_capacity if self._storage is not None else None
        if capacity is not None and cursor >= capacity:
            raise ValueError(f"{type(self).__name__} state_dict['cursor'] is {cursor}, outside "
                             f"[0, {capacity}): the storage holds {capacity} rows.")

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.check_state_dict(state_dict)
        self.cursor = int(state_dict["cursor"])
        self.write_count = int(state_dict["write_count"])

    def __repr__(self) -> str:
        return f"{type(self).__name__}(cursor={self.cursor}, write_count={self.write_count})"


def _check_counter(value: Any, field: str, owner: str) -> int:
    """``value`` as an int >= 0; ``ValueError`` naming ``owner``'s ``field`` otherwise."""
    if not is_int(value):
        raise ValueError(f"{owner} state_dict[{field!r}] must be an int, got "
                         f"{type(value).__name__} ({value!r}).")
    if int(value) < 0:
        raise ValueError(f"{owner} state_dict[{field!r}] is {int(value)}; it must be >= 0.")
    return int(value)


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
