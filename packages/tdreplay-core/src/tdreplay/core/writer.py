"""The :class:`Writer` contract and the default :class:`RoundRobinWriter`."""

from __future__ import annotations

import abc
from typing import Any

import torch

from ._stateful import StateDictCheckpointMixin
from ._utils import leading_dim, slice_leading
from .storage import Storage


class Writer(StateDictCheckpointMixin, abc.ABC):
    """Decides which rows of the storage new data goes to, and writes it.

    Contract:

    - ``add(item) -> row`` and ``extend(batch) -> rows`` (int64 tensor) write through
      ``storage.set`` and return the rows written. The storage validates the data before
      anything changes; a writer updates its own state (cursor, counts) only after the
      storage accepted the write, so a rejected write leaves everything as it was.
    - ``write_count``: items written since creation (or since ``empty(empty_write_count=True)``).
    - ``state_dict`` / ``load_state_dict`` / ``dumps`` / ``loads``.
    """

    #: Counters shared between processes, from a storage that offers them (see
    #: :meth:`register_storage`); ``None`` keeps the counters in this object.
    _shared_counters: Any = None

    def __init__(self) -> None:
        self._storage: Storage | None = None
        self._write_count = 0

    def register_storage(self, storage: Storage) -> None:
        """Attach the storage this writer fills.

        A storage shared between processes (e.g. ``LazyMemmapStorage``) offers
        ``shared_writer_counters()``: an int64 array ``[cursor, write_count]`` in shared memory.
        The writer then keeps its cursor and write count there, so every process writing
        through the same storage continues from the same position.
        """
        self._storage = storage
        counters = getattr(storage, "shared_writer_counters", None)
        self._shared_counters = counters() if counters is not None else None

    def _shared_counter(self, pos: int, name: str) -> int:
        counters = self._shared_counters
        return self.__dict__.get(name, 0) if counters is None else int(counters[pos])

    def _set_shared_counter(self, pos: int, name: str, value: int) -> None:
        counters = self._shared_counters
        if counters is None:
            self.__dict__[name] = value
        else:
            counters[pos] = value

    _write_count = property(lambda self: self._shared_counter(1, "_local_write_count"),
                            lambda self, v: self._set_shared_counter(1, "_local_write_count", v))

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        # shared counters are re-attached from the storage after unpickling
        state.pop("_shared_counters", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        storage = state.get("_storage")
        counters = getattr(storage, "shared_writer_counters", None) if storage is not None else None
        if counters is not None:
            self._shared_counters = _LazyCounters(storage)

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
        """Number of items written so far."""
        return self._write_count

    def _empty(self, empty_write_count: bool = True) -> None:
        if empty_write_count:
            self._write_count = 0

    def state_dict(self) -> dict[str, Any]:
        return {"write_count": self._write_count}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.check_state_dict(state_dict)
        self._write_count = int(state_dict["write_count"])

    def __repr__(self) -> str:
        return f"{type(self).__name__}(write_count={self._write_count})"


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

    def __init__(self) -> None:
        super().__init__()
        self._cursor = 0

    _cursor = property(lambda self: self._shared_counter(0, "_local_cursor"),
                       lambda self, v: self._set_shared_counter(0, "_local_cursor", v))

    def register_storage(self, storage: Storage) -> None:
        """Attach ``storage``; a cursor past its written rows moves back to their end.

        That happens when a used writer gets a fresh or smaller storage (``set_storage``,
        ``set_writer``): writing at the old cursor would leave unwritten rows in between.
        """
        super().register_storage(storage)
        numel = storage.row_numel
        written = len(storage) // numel if numel else 0
        if self._cursor > written:
            self._cursor = written

    def _before_write(self, data: Any, cursor: int, capacity: int, batched: bool) -> Any:
        """What is written: ``data`` itself; subclasses may return a changed copy.

        Called by :meth:`add` / :meth:`extend` with the row the write starts at and the
        storage's capacity in rows, once they are known and before anything is written.
        """
        return data

    def add(self, data: Any) -> int:
        storage = self.storage
        capacity = storage.rows_capacity_for(data, batched=False)
        row = self._cursor % capacity
        storage.set(row, self._before_write(data, row, capacity, batched=False))
        self._cursor = (row + 1) % capacity
        self._write_count += 1
        return row

    def extend(self, data: Any) -> torch.Tensor:
        storage = self.storage
        n = leading_dim(data)
        capacity = storage.rows_capacity_for(data, batched=True)
        cursor = self._cursor % capacity
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
        self._cursor = (cursor + n) % capacity
        self._write_count += n
        return rows

    @property
    def cursor(self) -> int:
        """Next row to be written."""
        return self._cursor

    def _empty(self, empty_write_count: bool = True) -> None:
        super()._empty(empty_write_count)
        self._cursor = 0

    def state_dict(self) -> dict[str, Any]:
        return {"cursor": self._cursor, "write_count": self._write_count}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.check_state_dict(state_dict)
        self._cursor = int(state_dict["cursor"])
        self._write_count = int(state_dict["write_count"])

    def __repr__(self) -> str:
        return f"{type(self).__name__}(cursor={self._cursor}, write_count={self._write_count})"


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
