"""Rows of a shared memmap storage that a writer or an in-place edit was changing when it died.

A :class:`~tdreplay.storages.LazyMemmapStorage` counts rows ``[0, len)`` as written, and the
count of a first write is committed after its data (rows past the count are invisible until
then). Overwriting rows that are already counted (a full ring, ``storage[i] = x``) cannot be
made invisible that way, so the writer records them first in the shared state (``begin``): a range
of rows in two counters, or for scattered rows a list in a journal file beside the state file.
The record stays until the process releases the lock (:meth:`TornWrites.settle_hold`, run
as the lock is released, or by the next write of the same hold): a buffer's ``extend`` moves
the writer's shared cursor and write count after the storage's ``set`` returns, under the same
hold, so a writer that dies between the two leaves the record, and its rows are dropped with
the counters put right, never left visible with counters that do not count them. A first write
past the count is recorded the same way (its rows are counted once the copy is done). A record
still there when another writer or reader takes the lock means its writer died in the middle
(the kernel released its ``flock``): those rows are half old, half new, or new with counters
that were not moved. :meth:`TornWrites.recover` then drops them:
the surviving rows are moved, oldest first (from the writer's cursor round), to the front, the
row count shrinks by the number of torn rows and the cursor points after the last survivor, so
the ring goes on in the same order and no whole row is lost. A record that no writer makes (a
range longer than the storage, bits of no kind: a damaged state file) drops nothing and raises
:class:`~._storage_errors.DamagedStorageError` (:meth:`TornWrites.check_record`).

The recovery survives being killed too. Before a row moves, it writes its plan (the count, the
cursor, the torn rows) to ``tdreplay-memmap-recovery.bin`` and replaces the record with "moving,
step 0" (one int64 store). The plan is a list of steps (:func:`recovery_steps`): the kept rows
after each torn row move down over it, in row order, then the ring is rotated (three
reversals) so that its oldest row is row 0. A step whose rows do not overlap copies them
directly; a step that writes rows it also reads first copies its sources to
``tdreplay-memmap-staging.bin`` and records "step i, staged". After each step the record
names the next one. Whoever takes the lock after a process died in the middle reads the plan
and goes on from the recorded step (from the staging file when it was staged): every step is
applied exactly once, however many recovering processes die, and the count and the cursor
change after the last step only. What it costs: one int64 per torn row in the plan, at most
``STAGE_BYTES`` of rows in memory and in the staging file at a time, and the moves the ring
order needs (the rows after the first torn one, and every kept row when the ring wrapped).

In-place edits of entries keep their rows instead. ``set_key``, ``update_`` and
``storage[tuple] = ...`` (and the buffer edits made of them: ``set_``, ``set_at_``, ``update_``,
``rb[tuple] = ...``, ``update_if_present``) change entries of rows that were committed whole,
and dropping those rows would lose committed data (an assignment of whole items, ``storage[i] =
x`` or ``rb[i] = x`` of counted rows, is journaled as an edit of every entry of those rows:
``set`` with ``set_cursor=False``). Once an edit is checked whole
(every value fits its entry: :mod:`~._entry_edits`) and before it writes anything, the old
values of the rows it touches, of the entries it writes, go to an undo journal
(``tdreplay-memmap-undo.bin``, :mod:`~._edit_journal`), and the record says "edits, n
segments" (:meth:`TornWrites.record_edit`: one int64 store, once the segments are whole). The
record stays until the process releases the lock (:meth:`TornWrites.settle_hold`, which the
lock runs as it is released, or a write of the same hold that needs the record), so the edits
of one hold (the entries of one ``update_if_present`` patch) are undone together. Whoever takes
the lock after an editor died writes the old values back, newest first (a restore killed in
turn is done again whole: it writes only old values), and clears the record: the rows are as
before the edits, none is dropped, the count and the cursor do not change. An edit that raises
once it has begun writes its own old values back before the error propagates
(:meth:`TornWrites.take_back_edit`).

A load (``load_state_dict``, a checkpoint's ``install``, ``rb.loads``) keeps the old buffer the
same way (:meth:`TornWrites.record_load`): before it writes anything, the old values of the
shared counters (the row count, the writer's cursor and write count) and of the counted rows it
replaces (every entry) go to the undo journal, and the record says "edits, n segments" until
the lock is released (a buffer's ``loads`` holds it until the writer's and the sampler's states
are in too). Whoever takes the lock after a loader died writes the rows and the counters back:
the buffer is exactly as before the load, whatever point the loader reached (never rows
dropped, nor a mixture of old and loaded rows); a load that raises writes them back itself.
What it costs: one copy of the replaced counted rows (those below the old count, at most the
loaded ones) to the journal file, written once, plus three int64.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tdreplay.core.atomic_files import replace_file
from tdreplay.core.revision import REFUSALS
from tdreplay.core.utils import as_long_tensor, is_int, range_tensor

from ._edit_journal import UNDO_FILE, EditJournal, Rows
from ._keys import NestedKey
from ._layout import TensorLayout
from ._storage_errors import DamagedStorageError

# slots of the shared state array (beside memmap_storage's _STATE_INIT .. _STATE_WRITES)
STATE_LEN = 1
STATE_CURSOR = 2
STATE_WRITES = 3
STATE_TORN = 4  # 0: no write in flight over counted rows, else what it covers (kind = low 2 bits)
STATE_TORN_START = 5
STATE_TORN_STOP = 6
#: Storage.shared_reset_count(): a recovery that drops rows moves the others, which counts as
#: a reset for what other processes keep about the rows (a ``sync=False`` sampler's trees)
STATE_RESETS = 8
#: the writer's write count + 1 when a write's record was made (0: none made, by an older
#: version): a write count moved since means the write returned and its writer's counters
#: moved, so its rows are whole and counted, not torn
STATE_TORN_WRITES = 10

_NONE, _RANGE, _JOURNAL, _PACKED = 0, 1, 2, 3
#: a recovery under way (kind bits 0): bit 3 set once the step's sources are staged, the
#: step's number from bit 4 up
_MOVING, _STAGED = 4, 8
#: in-place edits under way (kind bits 0, bit 2 clear): bit 3 set, the count of the undo
#: journal's segments from bit 4 up
_UNDO = 8
#: rows below this fit a packed range (start and stop in the one STATE_TORN counter)
PACKED_ROWS = 1 << 30

#: files beside the journal: the plan of a recovery under way, and the rows of its staged step
PLAN_FILE = "tdreplay-memmap-recovery.bin"
STAGE_FILE = "tdreplay-memmap-staging.bin"
#: most bytes of rows one recovery step moves (held in memory, and staged when it overlaps)
STAGE_BYTES = 16 << 20
_PLAN_MAGIC = 0x3165766F_6D726474  # b"tdrmove1" (little-endian)
_PLAN_HEADER = 5  # magic, written rows, cursor, rows per step, torn rows


def packed_range(start: int, stop: int) -> int:
    """Rows ``[start, stop)`` modulo the row capacity (``start`` below :data:`PACKED_ROWS`,
    ``stop`` below twice that: a range may wrap round the end) as one STATE_TORN value: one
    store records them (the hot path of a full ring)."""
    return (start << 33) | (stop << 2) | _PACKED


#: the counters a load changes, journaled before it (the row count, the writer's cursor and
#: write count)
LOAD_COUNTERS = (STATE_LEN, STATE_CURSOR, STATE_WRITES)


#: ``(source row, destination row, rows, reversed)``: rows ``[source, source + rows)`` go to
#: ``[destination, destination + rows)``, in reverse order when ``reversed``
Move = tuple[int, int, int, bool]


def recovery_steps(written: int, cursor: int, torn: Sequence[int],
                   block: int) -> list[tuple[Move, ...]]:
    """The steps that drop the ``torn`` rows (sorted, distinct, below ``written``) of a storage
    of ``written`` rows whose writer's cursor is ``cursor``: afterwards the kept rows are
    ``[0, written - len(torn))``, oldest first. Each step moves at most ``block`` rows (two
    when ``block`` is 1); all its sources are read before any of its destinations is written.

    Examples
    --------
    >>> rows = list(range(10))  # a full ring whose cursor is at 3: row 3 is the oldest
    >>> for step in recovery_steps(10, 3, [3, 4], block=4):
    ...     read = [rows[s:s + n][::-1] if rev else rows[s:s + n] for s, _, n, rev in step]
    ...     for (_, d, n, _), values in zip(step, read):
    ...         rows[d:d + n] = values
    >>> rows[:8]
    [5, 6, 7, 8, 9, 0, 1, 2]
    """
    steps: list[tuple[Move, ...]] = []
    bounds = [*torn, written]
    for j in range(len(torn)):  # the kept rows after torn row j move down by j + 1
        src, stop = bounds[j] + 1, bounds[j + 1]
        while src < stop:
            n = min(block, stop - src)
            steps.append(((src, src - j - 1, n, False),))
            src += n
    kept = written - len(torn)
    start = cursor if cursor < written else 0  # the oldest row, if kept
    shift = (start - bisect.bisect_left(torn, start)) % kept if kept else 0
    if shift and kept <= block:  # one step: the oldest rows to the front, the others after
        steps.append(((shift, 0, kept - shift, False), (0, kept - shift, shift, False)))
    elif shift:  # rotate left by ``shift``: three reversals
        for lo, hi in ((0, shift), (shift, kept), (0, kept)):
            steps.extend(_reversal(lo, hi, max(1, block // 2)))
    return steps


def _reversal(lo: int, hi: int, chunk: int) -> Iterator[tuple[Move, ...]]:
    """Steps reversing rows ``[lo, hi)``: chunks from both ends swapped, reversed."""
    half = (hi - lo) // 2
    done = 0
    while done < half:
        n = min(chunk, half - done)
        front, back = lo + done, hi - done - n
        yield (front, back, n, True), (back, front, n, True)
        done += n


def _overlaps(moves: tuple[Move, ...]) -> bool:
    """Whether a step writes rows it also reads (then its sources are staged first)."""
    return any(src < dst + m and dst < src + n
               for src, _, n, _ in moves for _, dst, m, _ in moves)


def _row_bytes(leaf: torch.Tensor) -> int:
    return leaf[0].numel() * leaf.element_size() if leaf.shape[0] else 0


class TornWrites:
    """The record of an overwrite in flight, kept in ``counters.array`` (the shared int64
    counters; ``counters`` pickles as its file, so a copy in another process maps the same
    memory) and ``journal`` (a file for scattered rows); a recovery under way keeps its plan
    in ``plan_file`` and the rows of a staged step in ``stage_file``, beside the journal."""

    def __init__(self, counters: Any, journal: Path) -> None:
        self.counters = counters
        self.journal = Path(journal)
        self.plan_file = self.journal.with_name(PLAN_FILE)
        self.stage_file = self.journal.with_name(STAGE_FILE)
        #: the old values of the rows the in-place edits of this lock hold overwrite
        self.edits = EditJournal(self.journal.with_name(UNDO_FILE))

    @property
    def state(self) -> np.ndarray:
        """The shared counters."""
        array: np.ndarray = self.counters.array
        return array

    def _counter_values(self) -> torch.Tensor:
        """The shared counters as a 1-D int64 tensor (the same memory), which the journal of a
        load reads and writes back."""
        return torch.from_numpy(self.counters.array)
    # ---- writer side (under the process lock) ---------------------------------------------------
    def begin(self, rows: int | slice | torch.Tensor | Sequence[int], written: int,
              capacity: int) -> bool:
        """Record the counted rows (``< written``) among ``rows`` before they are overwritten;
        ``False`` when none are (nothing recorded: a first write needs no record). The edits
        of this lock hold are settled first (the record is theirs until then)."""
        if self.state[STATE_TORN]:
            self.settle_hold()
        self.state[STATE_TORN_WRITES] = self.state[STATE_WRITES] + 1  # (before the record)
        if isinstance(rows, slice):
            start, stop, step = rows.indices(capacity)
            if step == 1:
                return start < min(stop, written) and self._record_range(start, stop)
            rows = range_tensor(range(start, stop, step))
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
        replace_file(self.journal, flat.cpu().numpy().astype(np.int64).tobytes(), durable=False)
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
        if isinstance(err, REFUSALS):  # (raised while checking data, before any copy)
            self.end()
        else:
            self.recover(layout)

    # ---- in-place edits (under the process lock) -------------------------------------------
    def record_rows(self, start: int, stop: int) -> None:
        """Record rows ``[start, stop)`` (a write under way, kept until the hold ends)."""
        self.state[STATE_TORN_WRITES] = self.state[STATE_WRITES] + 1  # (before the record)
        if 0 <= start < PACKED_ROWS and stop < 2 * PACKED_ROWS:
            self.counters.array[STATE_TORN] = packed_range(start, stop)
        else:
            self._record_range(start, stop)

    def record_edit(self, td: Any, keys: Sequence[NestedKey], rows: Rows) -> None:
        """Journal rows ``rows`` of entries ``keys`` of ``td`` (the storage's TensorDict) before
        an edit overwrites them, then record the journal (after the edits before it in this
        lock hold); raises before recording when the journal cannot be written."""
        segments = self.edits.append(td, keys, rows)
        if segments:
            self.state[STATE_TORN] = (segments << 4) | _UNDO

    def record_load(self, td: Any, keys: Sequence[NestedKey], rows: int) -> None:
        """Journal the counters a load changes (:data:`LOAD_COUNTERS`) and the first ``rows``
        rows of entries ``keys`` of ``td`` (the counted rows it replaces) before it writes
        anything, then record the journal; raises before recording when the journal cannot be
        written (nothing changed)."""
        slots = torch.tensor(LOAD_COUNTERS, dtype=torch.long)
        segments = self.edits.append(td, keys, slice(0, rows),
                                     counters=(self._counter_values(), slots))
        if segments:
            self.state[STATE_TORN] = (segments << 4) | _UNDO

    def take_back_edit(self, td: Any) -> None:
        """The last edit (or load) recorded raised: its old values back, and out of the
        record."""
        segments = self.edits.take_back(td, self._counter_values())
        if segments:
            self.state[STATE_TORN] = (segments << 4) | _UNDO
        else:
            self.settle_hold()

    def settle_hold(self) -> None:
        """The writes and edits of this lock hold are complete, and the counters that go with
        them moved (the lock is being released, or the hold writes again): clear their record
        (never a recovery's), then forget the edits' journal."""
        value = int(self.state[STATE_TORN])
        if value & 3 or (value and not value & _MOVING):  # a writer's or the edits' record
            self.end()
        self.edits.forget()

    # ---- anyone holding the process lock -----------------------------------------------------
    @property
    def pending(self) -> bool:
        """Whether a write over counted rows was left unfinished (or its recovery)."""
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
        if value & _MOVING:
            return torch.tensor(self._read_plan()[3], dtype=torch.long)
        return torch.arange(0)

    def recover(self, layout: TensorLayout | None) -> int:
        """Drop the rows of an unfinished overwrite, write back the old values of unfinished
        edits, or finish the recovery a process that died began (see the module docstring);
        returns how many counted rows were dropped."""
        value = int(self.state[STATE_TORN])
        if not value:
            return 0
        self.check_record(value, 0 if layout is None else layout.rows)
        if not value & 7:  # an editor's (or loader's) record: the old values back, no row dropped
            self.edits.restore(None if layout is None else layout.td, value >> 4,
                               counters=self._counter_values())
            self.edits.forget()  # (what this process held of it)
            self._finish()
            return 0
        if value & 3 and self._write_returned():  # whole rows its counters count: kept
            self._finish()
            return 0
        if value & 3:  # a writer's record: plan the moves first
            plan = self._plan(layout)
            if plan is None:  # no counted row torn: nothing moves
                self._finish()
                return 0
            value = _MOVING
        else:
            plan = self._read_plan()
        assert layout is not None  # (a plan is made from a layout)
        written, cursor, block, torn = plan
        steps = recovery_steps(written, cursor, torn, block)
        if value >> 4 > len(steps):
            raise DamagedStorageError(
                f"the state file of the memory-mapped storage in {str(self.journal.parent)!r} "
                f"records step {value >> 4} of a recovery of {len(steps)} steps: it is "
                "damaged. Nothing was changed; restore the storage from a checkpoint.")
        self._run(layout, steps, value >> 4, bool(value & _STAGED))
        kept = written - len(torn)
        self.state[STATE_LEN] = kept  # (again, if a process died after this: the same values)
        self.state[STATE_CURSOR] = kept % layout.rows
        if len(self.state) > STATE_RESETS:  # (not in a state file of before 0.2.1)
            self.state[STATE_RESETS] += 1  # (twice, if a process died after this: harmless)
        self._finish()
        return len(torn)

    def _write_returned(self) -> bool:
        """Whether the write a writer's record names returned and its writer's counters moved
        (the write count differs from the one recorded with it: a process killed later in
        the hold, inside ``rb.locked()``). Its rows were copied whole before the counters
        moved, so dropping them would lose a committed write."""
        recorded = int(self.state[STATE_TORN_WRITES])
        return recorded != 0 and int(self.state[STATE_WRITES]) != recorded - 1

    def check_record(self, value: int, capacity: int) -> None:
        """Raise :class:`DamagedStorageError` when ``value`` (the record, non-zero) is not one
        a writer, an editor or a recovery makes in a storage of ``capacity`` rows: a damaged
        state file would otherwise have rows dropped (or old values written back) that no
        write touched. Nothing is changed."""
        kind = value & 3
        if kind in (_PACKED, _RANGE):
            start, stop = (value >> 33, (value >> 2) & (PACKED_ROWS * 2 - 1)) \
                if kind == _PACKED else (int(self.state[STATE_TORN_START]),
                                         int(self.state[STATE_TORN_STOP]))
            # rows a write covers: at most the capacity, unless none of them is counted (a
            # first write past the count; or no rows laid out yet)
            well_formed = (value == _RANGE or kind == _PACKED) and 0 <= start < stop and (
                not capacity or stop - start <= capacity or start >= self.state[STATE_LEN])
        elif kind == _JOURNAL:
            well_formed = value == _JOURNAL
        else:  # a recovery's step, or the edits' segment count
            well_formed = value > 0 and bool(value & (_MOVING | _UNDO))
        if not well_formed:
            raise DamagedStorageError(
                f"the state file of the memory-mapped storage in "
                f"{str(self.journal.parent)!r} records an unfinished write ({value:#x}) that "
                "no writer makes: the file is damaged, and the rows it would name cannot be "
                "told. Nothing was changed; restore the storage from a checkpoint.")

    def _plan(self, layout: TensorLayout | None) -> tuple[int, int, int, list[int]] | None:
        """Write the plan of the recovery of the recorded rows (``None``: nothing to move),
        then record that it is under way."""
        written = int(self.state[STATE_LEN])
        if layout is None or not written:
            return None
        torn = self.torn_rows(layout.rows)
        torn = torch.unique(torn[(torn >= 0) & (torn < written)])
        if not torn.numel():
            return None
        capacity = layout.rows
        cursor = int(self.state[STATE_CURSOR]) % capacity
        row_bytes = sum(_row_bytes(leaf) for leaf in layout.leaves)
        block = max(1, STAGE_BYTES // max(row_bytes, 1))
        header = [_PLAN_MAGIC, written, cursor, block, int(torn.numel())]
        data = np.concatenate([np.array(header, dtype=np.int64), torn.numpy().astype(np.int64)])
        replace_file(self.plan_file, data.tobytes(), durable=False)
        self.state[STATE_TORN] = _MOVING  # step 0: from here on, the plan is the record
        return written, cursor, block, torn.tolist()

    def _read_plan(self) -> tuple[int, int, int, list[int]]:
        """``(written, cursor, block, torn)`` of the recovery under way."""
        try:
            data = np.fromfile(self.plan_file, dtype=np.int64)
        except (OSError, ValueError) as err:
            raise DamagedStorageError(f"the plan of an unfinished recovery of torn rows "
                                      f"({str(self.plan_file)!r}) cannot be read: {err}") \
                from err
        if len(data) < _PLAN_HEADER or int(data[0]) != _PLAN_MAGIC \
                or len(data) != _PLAN_HEADER + int(data[4]):
            raise DamagedStorageError(f"the plan of an unfinished recovery of torn rows "
                                      f"({str(self.plan_file)!r}) is damaged: the storage's "
                                      "rows cannot be trusted.")
        written, cursor, block = (int(v) for v in data[1:4])
        return written, cursor, block, data[_PLAN_HEADER:].tolist()

    def _run(self, layout: TensorLayout, steps: list[tuple[Move, ...]], first: int,
             staged: bool) -> None:
        """Apply ``steps[first:]`` to every leaf, recording each step done (``staged``: the
        sources of step ``first`` are in the staging file already)."""
        leaves = [leaf for leaf in layout.leaves if _row_bytes(leaf)]
        state = self.state
        stage = None
        try:
            for index in range(first, len(steps)):
                moves = steps[index]
                if staged or _overlaps(moves):
                    if stage is None:
                        stage = open(os.open(self.stage_file, os.O_RDWR | os.O_CREAT, 0o644),
                                     "r+b", buffering=0)
                    if not staged:
                        _stage(stage, leaves, moves)
                        state[STATE_TORN] = (index << 4) | _STAGED | _MOVING
                    _unstage(stage, leaves, moves)
                    staged = False
                else:  # sources and destinations apart: a repeat copies the same rows
                    for leaf in leaves:
                        for src, dst, n, rev in moves:
                            rows = leaf[src:src + n]
                            leaf[dst:dst + n].copy_(rows.flip(0) if rev else rows)
                state[STATE_TORN] = ((index + 1) << 4) | _MOVING
        finally:
            if stage is not None:
                stage.close()

    def _finish(self) -> None:
        """Clear the record, then the files it named."""
        self.end()
        for path in (self.journal, self.plan_file, self.stage_file, self.edits.path):
            path.unlink(missing_ok=True)


def _stage(stage: Any, leaves: list[torch.Tensor], moves: tuple[Move, ...]) -> None:
    """Write the source rows of ``moves`` to the staging file (moves, then leaves, in order)."""
    offset = 0
    for src, _, n, _ in moves:
        for leaf in leaves:
            raw = leaf[src:src + n].contiguous().reshape(-1).view(torch.uint8).numpy().data
            stage.seek(offset)
            while raw:
                raw = raw[stage.write(raw):]
            offset += n * _row_bytes(leaf)


def _unstage(stage: Any, leaves: list[torch.Tensor], moves: tuple[Move, ...]) -> None:
    """Write the staged source rows of ``moves`` to their destinations."""
    offset = 0
    for _, dst, n, rev in moves:
        for leaf in leaves:
            size = n * _row_bytes(leaf)
            buf = bytearray(size)
            view, got = memoryview(buf), 0
            stage.seek(offset)
            while got < size:
                read = stage.readinto(view[got:])
                if not read:
                    raise DamagedStorageError("the staging file of an unfinished recovery of "
                                              "torn rows is short: the storage's rows cannot "
                                              "be trusted.")
                got += read
            rows = torch.frombuffer(buf, dtype=torch.uint8).view(leaf.dtype) \
                .reshape(n, *leaf.shape[1:])
            leaf[dst:dst + n].copy_(rows.flip(0) if rev else rows)
            offset += size
