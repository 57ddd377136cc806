"""Rows of a shared memmap storage that a writer was overwriting when it died.

A :class:`~tdreplay.storages.LazyMemmapStorage` counts rows ``[0, len)`` as written, and the
count of a first write is committed after its data (rows past the count are invisible until
then). Overwriting rows that are already counted (a full ring, an in-place edit) cannot be made
invisible that way, so the writer records them first in the shared state (``begin``): a range
of rows in two counters, or for scattered rows a list in a journal file beside the state file.
The record is cleared when the copy is complete (``end``). A record still there when another
writer or reader takes the lock means its writer died in the middle (the kernel released its
``flock``): those rows are half old, half new. :meth:`TornWrites.recover` then drops them:
the surviving rows are moved, oldest first (from the writer's cursor round), to the front, the
row count shrinks by the number of torn rows and the cursor points after the last survivor, so
the ring goes on in the same order and no whole row is lost.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tdreplay.core.utils import as_long_tensor, is_int

from ._layout import TensorLayout

# slots of the shared state array (beside memmap_storage's _STATE_INIT .. _STATE_WRITES)
STATE_LEN = 1
STATE_CURSOR = 2
STATE_TORN = 4  # 0: no write in flight over counted rows, else what it covers (kind = low 2 bits)
STATE_TORN_START = 5
STATE_TORN_STOP = 6

_NONE, _RANGE, _JOURNAL, _PACKED = 0, 1, 2, 3
#: rows below this fit a packed range (start and stop in the one STATE_TORN counter)
PACKED_ROWS = 1 << 30


def packed_range(start: int, stop: int) -> int:
    """Rows ``[start, stop)`` modulo the row capacity (``start`` below :data:`PACKED_ROWS`,
    ``stop`` below twice that: a range may wrap round the end) as one STATE_TORN value: one
    store records them (the hot path of a full ring)."""
    return (start << 33) | (stop << 2) | _PACKED
#: exceptions a storage raises while checking data, before it writes anything
_REFUSALS = (ValueError, KeyError, TypeError, IndexError)


class TornWrites:
    """The record of an overwrite in flight, kept in ``counters.array`` (the shared int64
    counters; ``counters`` pickles as its file, so a copy in another process maps the same
    memory) and ``journal`` (a file for scattered rows)."""

    def __init__(self, counters: Any, journal: Path) -> None:
        self.counters = counters
        self.journal = Path(journal)

    @property
    def state(self) -> np.ndarray:
        """The shared counters."""
        array: np.ndarray = self.counters.array
        return array

    # ---- writer side (under the process lock) ---------------------------------------------------
    def begin(self, rows: int | slice | torch.Tensor | Sequence[int], written: int,
              capacity: int) -> bool:
        """Record the counted rows (``< written``) among ``rows`` before they are overwritten;
        ``False`` when none are (nothing recorded: a first write needs no record)."""
        if isinstance(rows, slice):
            start, stop, step = rows.indices(capacity)
            if step == 1:
                return start < min(stop, written) and self._record_range(start, stop)
            rows = torch.arange(start, stop, step)
        elif is_int(rows):
            row = int(rows) % capacity
            return row < written and self._record_range(row, row + 1)
        if isinstance(rows, torch.Tensor) and rows.dtype == torch.long:
            # what writers pass (1-D, on the CPU): no conversion
            flat = rows if rows.dim() == 1 and rows.device.type == "cpu" \
                else rows.reshape(-1).cpu()
        else:
            try:
                flat = as_long_tensor(rows, name="rows").reshape(-1).cpu()
            except (TypeError, ValueError, IndexError):
                return False  # the storage refuses them before writing
        n = flat.numel()
        if not n:
            return False
        first = int(flat[0])
        if 0 <= first < PACKED_ROWS and n <= capacity \
                and torch.equal(flat, torch.arange(first, first + n).remainder_(capacity)):
            # a range round the end (a round-robin writer wrapping): one store. (Rows out of
            # range fail this test, and the storage refuses them before writing.)
            self.counters.array[STATE_TORN] = packed_range(first, first + n)
            return True
        flat = flat[(flat >= -capacity) & (flat < capacity)] % capacity
        flat = flat[flat < written]
        if not flat.numel():
            return False
        tmp = self.journal.with_name(f"{self.journal.name}.{os.getpid()}.tmp")
        flat.cpu().numpy().astype(np.int64).tofile(tmp)
        os.replace(tmp, self.journal)
        self.state[STATE_TORN] = _JOURNAL
        return True

    def _record_range(self, start: int, stop: int) -> bool:
        state = self.counters.array
        state[STATE_TORN_START] = start
        state[STATE_TORN_STOP] = stop
        state[STATE_TORN] = _RANGE  # last: the range is whole once this says so
        return True

    def end(self) -> None:
        """The recorded rows are whole again: clear the record."""
        self.counters.array[STATE_TORN] = _NONE

    def failed(self, err: BaseException, layout: TensorLayout | None) -> None:
        """A write over recorded rows raised ``err``: a refusal (raised while checking the
        data, before any copy) clears the record, anything else drops the recorded rows."""
        if isinstance(err, _REFUSALS):
            self.end()
        else:
            self.recover(layout)

    # ---- anyone holding the process lock -----------------------------------------------------
    @property
    def pending(self) -> bool:
        """Whether a write over counted rows was left unfinished."""
        return bool(self.state[STATE_TORN])

    def torn_rows(self, capacity: int) -> torch.Tensor:
        """The rows the unfinished write was overwriting (empty when none), in a storage of
        ``capacity`` rows."""
        value = int(self.state[STATE_TORN])
        kind = value & 3
        if kind == _PACKED:
            stop = (value >> 2) & (PACKED_ROWS * 2 - 1)
            return torch.arange(value >> 33, stop) % max(capacity, 1)
        if kind == _RANGE:
            return torch.arange(int(self.state[STATE_TORN_START]),
                                int(self.state[STATE_TORN_STOP]))
        if kind == _JOURNAL:
            try:
                return torch.from_numpy(np.fromfile(self.journal, dtype=np.int64))
            except (OSError, ValueError):
                return torch.arange(0)
        return torch.arange(0)

    def recover(self, layout: TensorLayout | None) -> int:
        """Drop the rows of an unfinished overwrite (see the module docstring); returns how
        many counted rows were dropped."""
        if not self.pending:
            return 0
        written = int(self.state[STATE_LEN])
        torn = self.torn_rows(layout.rows if layout is not None else 1)
        torn = torn[(torn >= 0) & (torn < written)]
        dropped = 0
        if layout is not None and written and torn.numel():
            capacity = layout.rows
            cursor = int(self.state[STATE_CURSOR]) % capacity
            start = cursor if cursor < written else 0
            order = (torch.arange(written) + start) % written  # oldest first
            keep = torch.ones(written, dtype=torch.bool)
            keep[torn] = False
            order = order[keep[order]]
            kept = int(order.numel())
            if kept:
                moved = [leaf.index_select(0, order) for leaf in layout.leaves]
                for leaf, rows in zip(layout.leaves, moved):
                    leaf[:kept].copy_(rows)
            dropped = written - kept
            self.state[STATE_LEN] = kept
            self.state[STATE_CURSOR] = kept % capacity
        self.end()
        self.journal.unlink(missing_ok=True)
        return dropped
