"""The undo journal of in-place edits of a shared memmap storage's counted rows (imports no
storage).

An in-place edit (``set_key``, ``update_``, ``storage[tuple] = ...``) overwrites rows that
other processes count and read. Before it writes anything, :meth:`EditJournal.append` copies
the old values of the rows it touches (whole rows, of the entries it writes: see
:func:`touched_rows`) to ``tdreplay-memmap-undo.bin`` beside the storage's state file; the
storage's torn-write record (``_torn_writes.py``) then counts the journal's segments. If the
editing process dies before the record is cleared, whoever takes the lock next writes the old
values back (:meth:`EditJournal.restore`, newest segment first): the rows are exactly as they
were before the edits, none is dropped. A restore writes only old values, so a restore killed
in turn is simply done again by the next process.

A load (a checkpoint's ``install``, ``load_state_dict``) is journaled the same way, as one
edit: first the old values of the storage's shared counters (its row count, the writer's
cursor and write count: a segment whose key is ``null``, see :meth:`EditJournal.append`), then
the old values of the counted rows it replaces, of every entry. A loader that dies leaves the
storage as it was before the load (rows, count and cursor), never a mixture.

The file: a magic int64, then one segment per entry and edit: ``[segment magic, key bytes,
first row, rows, data bytes]`` (int64), the entry's key path as JSON (``null`` for the
counters; padded to 8 bytes), the row numbers (int64; none when the rows are the run from
``first row``, else ``first row`` is -1) and the rows' old bytes. Segments past the record's
count (an edit whose journal was not complete, the edits of an earlier lock hold) are never
read. What it costs: the bytes of the edited rows' entries (and 8 bytes a row for scattered
rows), written once, at most ``block_bytes`` of them in memory at a time; for a load, the
bytes of the counted rows it replaces (at most the loaded ones) and 24 bytes of counters. The
editing process keeps the file open from one edit to the next (created once, emptied when it
grew past ``keep_bytes``).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tdreplay.core.utils import range_tensor

from ._keys import NestedKey, as_key, key_path
from ._storage_errors import DamagedStorageError

__all__ = ["UNDO_FILE", "EditJournal", "Rows", "count_rows", "touched_rows"]

UNDO_FILE = "tdreplay-memmap-undo.bin"
_MAGIC = 0x316F646E_75726474  # b"tdrundo1" (little-endian)
_SEGMENT = 0x31676573_6F646E75  # b"undoseg1"
_SEGMENT_HEADER = 5  # segment magic, key bytes, first row (-1: a list), rows, data bytes

#: rows of a storage: a run ``slice(start, stop)`` or row numbers (1-D int64; a row listed
#: twice is journaled twice, with the same old values)
Rows = slice | torch.Tensor


def touched_rows(index: Any, rows: int) -> Rows:
    """The rows of the first ``rows`` that a write at ``index`` of them may change (``None``:
    all of them), from the part of ``index`` that addresses the first dimension: a run as a
    slice, else row numbers (as the index gives them: a row may come twice); an index of
    another form (an ``Ellipsis`` or ``None`` first, a bool scalar) gives every row. ``index``
    was checked against those rows.

    Examples
    --------
    >>> touched_rows(None, 3), touched_rows(slice(1, None), 4)
    (slice(0, 3, None), slice(1, 4, None))
    >>> touched_rows((torch.tensor([4, -2, 1]), 0), 5).tolist()
    [4, 3, 1]
    >>> touched_rows(torch.tensor([[False, True], [False, False], [True, True]]), 3).tolist()
    [0, 2]
    >>> touched_rows((Ellipsis, 0), 2)
    slice(0, 2, None)
    """
    first = (index[0] if index else None) if isinstance(index, tuple) else index
    if first is None or first is Ellipsis or isinstance(first, (bool, np.bool_)):
        return slice(0, rows)
    if isinstance(first, slice):
        start, stop, step = first.indices(rows)
        return slice(start, max(start, stop)) if step == 1 \
            else range_tensor(range(start, stop, step))
    try:
        picked = torch.as_tensor(first).cpu()
    except (TypeError, ValueError, RuntimeError):
        return slice(0, rows)
    if picked.dtype is torch.bool:
        if not picked.dim():
            return slice(0, rows)
        return picked.reshape(picked.shape[0], -1).any(1).nonzero().reshape(-1)
    if picked.is_floating_point() or picked.is_complex() or not rows:
        return slice(0, rows)
    return picked.reshape(-1).long() % rows


def count_rows(rows: Rows) -> int:
    """How many rows ``rows`` holds."""
    return rows.stop - rows.start if isinstance(rows, slice) else rows.numel()


def _row_bytes(leaf: torch.Tensor) -> int:
    return math.prod(leaf.shape[1:]) * leaf.element_size() if leaf.shape[0] else 0


def _pwrite(fd: int, data: Any, offset: int) -> int:
    """Write all of ``data`` (bytes-like) at ``offset``; the offset after it."""
    view = memoryview(data).cast("B")
    while view:
        done = os.pwrite(fd, view, offset)
        view, offset = view[done:], offset + done
    return offset


def _pread(fd: int, size: int, offset: int) -> bytearray:
    """``size`` bytes at ``offset``; ``RuntimeError`` when the file is shorter."""
    buf = bytearray()
    while len(buf) < size:
        read = os.pread(fd, size - len(buf), offset + len(buf))
        if not read:
            raise RuntimeError("is short")
        buf += read
    return buf


def _blocks(rows: Rows, block: int) -> list[Rows]:
    """``rows`` in parts of at most ``block`` rows."""
    if isinstance(rows, slice):
        return [slice(i, min(i + block, rows.stop)) for i in range(rows.start, rows.stop, block)]
    return list(rows.split(block))


def _old_rows(leaf: torch.Tensor, rows: Rows) -> Any:
    """The bytes of ``rows`` of ``leaf`` as they are now (a copy), on the host."""
    old = leaf[rows] if isinstance(rows, slice) else leaf.index_select(0, rows.to(leaf.device))
    return old.cpu().contiguous().reshape(-1).view(torch.uint8).numpy()


class EditJournal:
    """The undo journal of the edits of one lock hold, in the file ``path``.

    :meth:`append` adds an edit's old values, :meth:`restore` writes them back (at recovery,
    or to take back the last edit of this process: :meth:`take_back`), :meth:`forget` forgets
    them once the edits are complete. The storage's record counts the segments
    (:attr:`segments`): it is set after the segments it counts are whole, and cleared before
    they are forgotten.

    Examples
    --------
    >>> import tempfile
    >>> from tensordict import TensorDict
    >>> td = TensorDict({"a": torch.arange(4.0), "b": torch.zeros(4, 2)}, [4])
    >>> journal = EditJournal(Path(tempfile.mkdtemp()) / UNDO_FILE)
    >>> journal.append(td, ["a"], torch.tensor([1, 3]))  # segments so far
    1
    >>> td["a"][torch.tensor([1, 3])] = -1.0  # the edit
    >>> journal.restore(td, journal.segments)  # its process died: the old values back
    >>> td["a"].tolist()
    [0.0, 1.0, 2.0, 3.0]
    """

    #: most bytes of rows copied at a time (to the file, or back into the storage)
    block_bytes = 16 << 20
    #: a journal file larger than this is emptied once its edits are complete
    keep_bytes = 1 << 20

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._fd = -1
        self._pid = -1  # the process that opened _fd
        self._end = 8  # where the next segment goes
        self._count = 0  # segments journaled
        self._edits: list[tuple[int, int]] = []  # (first segment, its offset) of each edit

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path}  # (a copy holds no edits: they are this process's)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"])  # type: ignore[misc]

    @property
    def segments(self) -> int:
        """The segments of the edits journaled (what the record counts)."""
        return self._count if self._pid == os.getpid() else 0

    # ---- the editing process ------------------------------------------------------------------
    def append(self, td: Any, keys: Sequence[NestedKey], rows: Rows,
               counters: tuple[torch.Tensor, torch.Tensor] | None = None) -> int:
        """Journal ``rows`` of entries ``keys`` of ``td`` (the storage's TensorDict) as they are
        now, before an edit writes them; returns :attr:`segments`. Raises (``OSError`` for a
        full disk) before any segment of the edit is counted: nothing changes.

        ``counters``: ``(values, slots)``, a 1-D int64 tensor (the storage's shared counters)
        and the slots of it to journal first (a load, which changes the row count and the
        cursor): :meth:`restore` given the same ``values`` writes them back."""
        if not self._count:
            self._open()
        start, count = self._end, self._count
        try:
            if counters is not None:
                count += self._segment(counters[0], None, counters[1])
            for key in keys:
                count += self._segment(td.get(key), key, rows)
        except BaseException:
            self._end = start
            raise
        self._edits.append((self._count, start))
        self._count = count
        return count

    def _open(self) -> None:
        """The file, open, as this process left it (else created anew: a recovery removes it)."""
        fd, pid = self._fd, os.getpid()
        if fd >= 0 and self._pid == pid:
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except OSError:
                same = False
            if same:
                return
        if fd >= 0:  # (or a forked child's copy of its parent's)
            os.close(fd)
        self._fd, self._pid = -1, pid
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            _pwrite(fd, np.array([_MAGIC], dtype=np.int64), 0)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def _segment(self, leaf: torch.Tensor, key: NestedKey | None, rows: Rows) -> int:
        """Write the segment of one entry (``key`` ``None``: of the counters) at the end; 1
        (0: no bytes to keep)."""
        row_bytes, n = _row_bytes(leaf), count_rows(rows)
        if not row_bytes or not n:
            return 0
        name = json.dumps(None if key is None else list(key_path(key))).encode()
        name += b" " * (-len(name) % 8)
        first = rows.start if isinstance(rows, slice) else -1
        head = np.array([_SEGMENT, len(name), first, n, n * row_bytes], dtype=np.int64)
        listed = b"" if isinstance(rows, slice) else rows.numpy().astype(np.int64).tobytes()
        fd = self._fd
        offset = _pwrite(fd, head.tobytes() + name + listed, self._end)
        for part in _blocks(rows, max(1, self.block_bytes // row_bytes)):
            offset = _pwrite(fd, _old_rows(leaf, part), offset)
        self._end = offset
        return 1

    def take_back(self, td: Any, counters: torch.Tensor | None = None) -> int:
        """Write back the old values of the last edit journaled (it raised) and forget it;
        returns :attr:`segments` left (the record is then to count these)."""
        first, start = self._edits[-1]
        self.restore(td, self._count, first, counters)
        self._edits.pop()
        self._count, self._end = first, start
        return first

    def forget(self) -> None:
        """Forget the edits journaled (complete, or written back); the file stays open for the
        next ones, emptied when it grew past :attr:`keep_bytes`."""
        if self._end > self.keep_bytes and self._fd >= 0 and self._pid == os.getpid():
            try:
                os.ftruncate(self._fd, 8)
            except OSError:
                pass  # (its bytes are never read: no record counts them)
        self._count, self._edits, self._end = 0, [], 8

    # ---- anyone holding the lock ----------------------------------------------------------------
    def restore(self, td: Any, count: int, first: int = 0,
                counters: torch.Tensor | None = None) -> None:
        """Write back segments ``[first, count)`` of the file, newest first, into ``td``'s
        entries (and a load's old counters into ``counters``, the storage's shared counters as
        a 1-D int64 tensor). :class:`DamagedStorageError` when the file cannot be read whole
        (the rows cannot be trusted)."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError as err:
            raise self._damaged(err) from err
        try:
            for key, rows, offset in reversed(self._read(fd, count)[first:]):
                if key is not None and td is None:
                    continue  # (no rows laid out: none to write back)
                self._restore_segment(fd, counters if key is None else td.get(key), key,
                                      rows, offset)
        except (RuntimeError, ValueError, KeyError, TypeError, IndexError) as err:
            raise self._damaged(err) from err
        finally:
            os.close(fd)

    def _read(self, fd: int, count: int) -> list[tuple[NestedKey | None, Rows, int]]:
        """``(key, rows, offset of the old bytes)`` of the first ``count`` segments (key
        ``None``: the counters' segment of a load)."""
        if np.frombuffer(_pread(fd, 8, 0), dtype=np.int64)[0] != _MAGIC:
            raise RuntimeError("has no journal header")
        out: list[tuple[NestedKey | None, Rows, int]] = []
        offset = 8
        for _ in range(count):
            magic, name, first, n, size = np.frombuffer(
                _pread(fd, 8 * _SEGMENT_HEADER, offset), dtype=np.int64).tolist()
            if magic != _SEGMENT or min(name, n, size) < 0 or first < -1:
                raise RuntimeError("holds a damaged segment")
            offset += 8 * _SEGMENT_HEADER
            path = json.loads(bytes(_pread(fd, name, offset)))
            key = None if path is None else as_key(path)
            offset += name
            rows: Rows = slice(first, first + n)
            if first < 0:
                rows = torch.frombuffer(_pread(fd, 8 * n, offset), dtype=torch.int64)
                offset += 8 * n
            out.append((key, rows, offset))
            offset += size
        return out

    def _restore_segment(self, fd: int, leaf: Any, key: NestedKey | None, rows: Rows,
                         offset: int) -> None:
        row_bytes = _row_bytes(leaf) if isinstance(leaf, torch.Tensor) else 0
        if not row_bytes:
            raise RuntimeError("holds the counters of a load, which were not given" if key is None
                               else f"names entry {key!r}, which holds no rows")
        for part in _blocks(rows, max(1, self.block_bytes // row_bytes)):
            n = count_rows(part)
            raw = _pread(fd, n * row_bytes, offset)
            offset += n * row_bytes
            old = torch.frombuffer(raw, dtype=torch.uint8).view(leaf.dtype) \
                .reshape(n, *leaf.shape[1:]).to(leaf.device)
            if isinstance(part, slice):
                leaf[part].copy_(old)
            else:
                leaf.index_copy_(0, part.to(leaf.device), old)

    def _damaged(self, err: BaseException) -> DamagedStorageError:
        return DamagedStorageError(f"the undo journal of an unfinished in-place edit "
                                   f"({str(self.path)!r}) cannot be read ({err}): the "
                                   "storage's rows cannot be trusted.")
