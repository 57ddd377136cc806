"""Where a storage's rows and slots are: its geometry (capacity in rows, slots per row), which
slots hold written data (``contains``, ``i in storage``, ``iter(storage)``), and which rows a
user's index selects for a write (``storage[index] = value``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from .utils import as_long_tensor, is_int, leading_dim, range_tensor

__all__ = ["StorageIndexError", "StorageIndexing"]


class StorageIndexError(IndexError, RuntimeError):
    """A write at a row a storage cannot address: past a :class:`ListStorage`'s ``max_size``,
    leaving a gap after the written rows, or an index assignment (``rb[i] = x``) past them.
    Nothing is written.

    An ``IndexError`` as tdreplay raised before, and a ``RuntimeError`` as TorchRL's list
    storages raise, so that ``except RuntimeError:`` written for TorchRL keeps working.

    Examples
    --------
    >>> from tdreplay.core import ListStorage
    >>> s = ListStorage(2)
    >>> try:
    ...     s.set(5, "x")
    ... except RuntimeError as err:
    ...     print(type(err).__name__, len(s))
    StorageIndexError 0
    """


class StorageIndexing:
    """The rows and slots of a :class:`~tdreplay.core.Storage` (see the module docstring)."""

    if TYPE_CHECKING:  # what the storage this is mixed into provides
        ndim: int
        @property
        def max_size(self) -> int: ...
        def __len__(self) -> int: ...
        def __getitem__(self, index: Any) -> Any: ...
        def get(self, index: Any) -> Any: ...
        def set(self, cursor: Any, data: Any, *, set_cursor: bool = True) -> None: ...

    @property
    def rows_capacity(self) -> int | None:
        """Capacity along the leading dimension (``None`` while a lazy layout is unknown)."""
        return self.max_size

    def rows_capacity_for(self, data: Any, batched: bool) -> int:
        """Capacity along the leading dimension once ``data`` is written.

        Lazy storages lay out from the first write, so they compute it from ``data``.
        """
        return self.max_size

    @property
    def row_numel(self) -> int:
        """Slots per row (1 when ``ndim == 1``)."""
        return 1

    @property
    def rows_written(self) -> int:
        """Rows written along the leading dimension (``len(self)`` slots over
        :attr:`row_numel`): where a round-robin writer goes on while the storage has free
        rows.

        Examples
        --------
        >>> from tdreplay.core import ListStorage
        >>> s = ListStorage(4)
        >>> s.set(range(3), [1, 2, 3])
        >>> s.rows_written
        3
        """
        numel = self.row_numel
        return len(self) // numel if numel else 0

    @property
    def initialized(self) -> bool:
        """Whether the storage layout exists (lazy storages lay out on the first write)."""
        return True

    def rows_to_slots(self, rows: torch.Tensor) -> torch.Tensor:
        """Flat slots covered by ``rows``: shape ``[*rows.shape, *inner]``."""
        return rows

    def valid_slots_mask(self, slots: torch.Tensor) -> torch.Tensor:
        """Boolean mask of ``slots`` that hold written data."""
        return (slots >= 0) & (slots < len(self))

    def __contains__(self, index: int | torch.Tensor) -> bool | torch.Tensor:
        """``index in storage``: :meth:`contains` (whether the slot holds written data), as
        TorchRL's, not a search of the stored values.

        Examples
        --------
        >>> import torch; from tdreplay.core import ListStorage
        >>> s = ListStorage(10)
        >>> s.set(torch.tensor([0, 1]), ["a", "b"])
        >>> 1 in s, 2 in s, "a" in s.items()
        (True, False, True)
        """
        return self.contains(index)

    def __iter__(self) -> Iterator[Any]:
        """The written rows in slot order, ``storage[i]`` for ``i`` in ``range(len(storage))``
        (TorchRL's); a storage of several dims (``ndim > 1``, whose ``len`` counts slots and
        ``storage[i]`` indexes its first dim) gives each slot's item, ``storage.get(i)``.

        Examples
        --------
        >>> import torch; from tdreplay.core import ListStorage
        >>> s = ListStorage(10)
        >>> s.set(torch.tensor([0, 1]), ["a", "b"])
        >>> list(s)
        ['a', 'b']
        """
        read = self.__getitem__ if self.ndim == 1 else self.get
        for i in range(len(self)):
            yield read(i)

    def contains(self, index: int | torch.Tensor) -> bool | torch.Tensor:
        """Whether the slot ``index`` holds written data (TorchRL's ``storage.contains``).

        A negative int counts from the end of the written slots, as for a list. A tensor of
        slots gives a boolean tensor of its shape (:meth:`valid_slots_mask`).

        Examples
        --------
        >>> import torch; from tdreplay.core import ListStorage
        >>> s = ListStorage(10)
        >>> s.contains(0)
        False
        >>> s.set(0, "a")
        >>> s.contains(0), s.contains(-1), s.contains(1)
        (True, True, False)
        >>> s.contains(torch.tensor([0, 1, 9])).tolist()
        [True, False, False]
        """
        if isinstance(index, torch.Tensor) and index.ndim:
            return self.valid_slots_mask(index)
        if not is_int(index):
            raise TypeError(f"index must be an int or an integer tensor, got "
                            f"{type(index).__name__}.")
        slot = int(index)
        if slot < 0:
            slot += len(self)
        return bool(self.valid_slots_mask(torch.tensor([slot]))[0])

    def index_to_rows(self, index: Any, value: Any = None) -> torch.Tensor:
        """Rows a user index (int, slice, integer or boolean tensor) selects on dim 0.

        Indices are resolved against the *written* rows, as reads are, so ``rb[i] = x`` writes
        where ``rb[i]`` reads: ``-1`` is the last written row and ``rb[:]`` all written rows.
        Integer indices must address written rows (``extend`` adds rows); a slice with an
        explicit stop past them (``write_all`` of more rows than are written) reaches up to the
        capacity, without leaving a gap. A slice without a stop takes as many rows from its
        start as ``value`` has (``rb[n:] = items`` appends them, as a list's slice assignment
        and TorchRL's list storages do); fewer rows than it covers are refused by ``set``.
        ``value`` (what is being written) lays out a lazy storage's capacity before its first
        write.

        Examples
        --------
        >>> from tdreplay.core import ListStorage
        >>> s = ListStorage(8)
        >>> s.set(range(3), ["a", "b", "c"])
        >>> s.index_to_rows(slice(2, None), ["C", "d", "e"]).tolist()
        [2, 3, 4]
        >>> s[2:] = ["C", "d", "e"]
        >>> s[:]
        ['a', 'b', 'C', 'd', 'e']
        """
        if isinstance(index, tuple):
            index = index[0] if index else slice(None)
        n = self.rows_written
        if isinstance(index, slice):
            step = 1 if index.step is None else index.step
            start = 0 if index.start is None else index.start
            start = max(start + n, 0) if start < 0 else start
            stop = index.stop
            if stop is None and value is not None and step == 1:
                stop = _open_stop(start, n, value)  # (past n: appends, as a list's)
            if stop is None or stop <= n:
                return range_tensor(range(*index.indices(n)))  # (empty: rb[5:2] = [])
            cap = self.rows_capacity
            if cap is None:
                cap = self.rows_capacity_for(value, batched=True) if value is not None else 0
            if step <= 0 or start > n:
                raise StorageIndexError(f"index {index} would write past the {n} written rows "
                                        "with a gap or backwards: use extend to add rows.")
            return range_tensor(range(start, min(stop, cap), step))
        if isinstance(index, torch.Tensor) and index.dtype is torch.bool:
            if index.ndim != 1 or index.shape[0] != n:  # as torch: a mask covers every row
                raise IndexError(f"a boolean index must have one entry per written row ({n}), "
                                 f"got shape {tuple(index.shape)}.")
            rows = index.nonzero().squeeze(-1)
        else:
            rows = as_long_tensor(index, name="index").reshape(-1)
        rows = torch.where(rows < 0, rows + n, rows)
        if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= n):
            raise StorageIndexError(f"index {index!r} is out of range: {n} rows are written "
                                    "(index assignment overwrites written rows; extend adds "
                                    "rows).")
        return rows

    def __setitem__(self, index: Any, value: Any) -> None:
        """Write ``value`` at the rows selected by ``index`` (see :meth:`index_to_rows`)."""
        rows = self.index_to_rows(index, value)
        # an in-place edit: the writer's cursor, and the newest row of the ring, stay
        if is_int(index):
            self.set(int(rows[0]), value, set_cursor=False)
        elif isinstance(index, slice) and rows.numel() > 1 and int(rows[1] - rows[0]) == 1:
            self.set(slice(int(rows[0]), int(rows[-1]) + 1), value, set_cursor=False)
        else:
            self.set(rows, value, set_cursor=False)



def _open_stop(start: int, written: int, value: Any) -> int | None:
    """The stop of a slice ``start:`` (its first row) written with ``value``: ``start`` plus
    the rows of ``value`` where that reaches past the ``written`` rows, else ``None`` (the
    written rows from ``start``; also for a value without a leading dim, written to every
    row)."""
    try:
        count = leading_dim(value)
    except (ValueError, TypeError):  # one item for every row of the slice
        return None
    return start + count if start + count > written else None
