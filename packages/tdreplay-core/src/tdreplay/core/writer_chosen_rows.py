"""Writes at rows the caller chooses (:class:`ChosenRowWrites`, mixed into
:class:`~tdreplay.core.writer.RoundRobinWriter`): ``write_at`` (TorchRL's) and
``extend_reusing`` (a consuming buffer's, into the slots it freed), each complete or not done
when an interrupt cuts it short (see ``RoundRobinWriter._complete_write``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from .utils import is_int, leading_dim

if TYPE_CHECKING:
    from .storage import Storage

__all__ = ["ChosenRowWrites", "index_tensor"]


def index_tensor(index: Any) -> torch.Tensor:
    """``index`` (an int, a sequence or tensor of ints, or a tuple of coordinates whose first
    names the row) as an int64 tensor."""
    if isinstance(index, tuple):
        index = index[0]
    return torch.as_tensor(index, dtype=torch.long)


class ChosenRowWrites:
    """``write_at`` and ``extend_reusing`` of a writer with a cursor and a write count."""

    if TYPE_CHECKING:  # what the writer this is mixed into provides
        _counters: Any
        interrupted_rows: torch.Tensor | int | None
        cursor: int

        @property
        def storage(self) -> Storage: ...
        def extend(self, data: Any) -> torch.Tensor: ...
        def prepare_write(self, data: Any, cursor: int | torch.Tensor, capacity: int,
                          batched: bool) -> Any: ...
        def _bump_generations(self, storage: Storage, rows: torch.Tensor | int,
                              capacity: int) -> None: ...
        def _complete_write(self, where: Any, data: Any, rows: torch.Tensor | int,
                            counted: int, cursor: int | torch.Tensor) -> None: ...

    def write_at(self, index: Any, data: Any) -> int | torch.Tensor:
        """Write ``data`` at rows ``index`` (as TorchRL) without moving the cursor: one item at
        an int ``index``, else a batch, one row per item. The rows' generations advance
        (handles on them go stale). Returns the rows (an int for an int ``index``).

        Examples
        --------
        >>> from tdreplay.core import ListStorage, RoundRobinWriter
        >>> w = RoundRobinWriter()
        >>> w.register_storage(ListStorage(4))
        >>> w.extend(["a", "b", "c"]).tolist()
        [0, 1, 2]
        >>> w.write_at(torch.tensor([2, 0]), ["C", "A"]).tolist(), w.write_at(1, "B")
        ([2, 0], 1)
        >>> w.storage[:], w.cursor, w.write_count
        (['A', 'B', 'C'], 3, 6)
        """
        if is_int(index):
            return self._write_one_at(int(index), data)
        rows = index_tensor(index).reshape(-1)
        n = leading_dim(data)
        if rows.numel() != n:
            raise ValueError(f"index addresses {rows.numel()} rows but data holds {n} items.")
        storage = self.storage
        capacity = storage.rows_capacity_for(data, batched=True)
        if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= capacity):
            raise IndexError(f"index must address rows in [0, {capacity}), got "
                             f"{rows.tolist()}.")
        data = self.prepare_write(data, rows, capacity, batched=True)
        counted = self._counters[1]
        try:  # (no cost unless raised)
            storage.set(rows, data)
            self._bump_generations(storage, rows, capacity)
            self._counters[1] += n  # the count moves last
        except BaseException:
            self._complete_write(rows, data, rows, counted, self.cursor)
            raise
        return rows

    def _write_one_at(self, row: int, data: Any) -> int:
        storage = self.storage
        capacity = storage.rows_capacity_for(data, batched=False)
        if not 0 <= row < capacity:
            raise IndexError(f"index must address a row in [0, {capacity}), got {row}.")
        data = self.prepare_write(data, row, capacity, batched=False)
        counted = self._counters[1]
        try:  # (no cost unless raised)
            storage.set(row, data)
            self._bump_generations(storage, torch.tensor([row]), capacity)
            self._counters[1] += 1  # the count moves last
        except BaseException:
            self._complete_write(row, data, row, counted, self.cursor)
            raise
        return row

    def extend_reusing(self, rows: Any, data: Any) -> torch.Tensor:
        """Write a batch: its first items into ``rows`` (consumed slots, in that order), the
        rest at the cursor, which skips ``rows`` and moves past the last row it wrote (as
        TorchRL's consuming buffers). A batch of ``capacity`` items or more overwrites every
        row: it is written as :meth:`extend` writes it.

        Examples
        --------
        >>> from tdreplay.core import ListStorage, RoundRobinWriter
        >>> w = RoundRobinWriter()
        >>> w.register_storage(ListStorage(6))
        >>> w.extend(list("abcdef")).tolist(), w.cursor
        ([0, 1, 2, 3, 4, 5], 0)
        >>> w.extend_reusing(torch.tensor([4, 1]), list("EBxy")).tolist(), w.cursor
        ([4, 1, 0, 2], 3)
        >>> w.storage[:]
        ['x', 'B', 'y', 'd', 'E', 'f']
        """
        reused = index_tensor(rows).reshape(-1)
        n = leading_dim(data)
        if reused.numel() > n:
            raise ValueError(f"rows names {reused.numel()} rows but data holds {n} items.")
        capacity = self.storage.rows_capacity_for(data, batched=True)
        if not reused.numel() or n >= capacity:
            return self.extend(data)
        cursor = self.cursor % capacity
        k = reused.numel()
        # the next rows from the cursor, skipping the reused ones (at most k are skipped)
        ahead = (cursor + torch.arange(n)) % capacity
        ahead = ahead[~torch.isin(ahead, reused)][: n - k]
        rows = torch.cat([reused, ahead])
        after = (int(ahead[-1]) + 1) % capacity if ahead.numel() else self.cursor
        counted = self._counters[1]
        try:  # (no cost unless raised)
            written = self.write_at(rows, data)
            self.cursor = after
        except BaseException:  # write_at wrote the rows whole or not at all (its count says)
            if self._counters[1] != counted:
                self.cursor, self.interrupted_rows = after, rows
            raise
        assert isinstance(written, torch.Tensor)
        return written
