"""A tensor storage is filled without gaps (no storage imports): a ``set`` past its written
rows that would leave rows between them and those it writes unwritten is refused
(:func:`check_no_gap`), as a :class:`~tdreplay.core.ListStorage`'s is. The written rows are
counted up to the highest one written, so the rows of such a gap would count as data (zeros)
and be sampled; TorchRL's tensor storages count them so.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tdreplay.core.utils import as_long_tensor, range_tensor

__all__ = ["check_no_gap", "gap_error"]


def check_no_gap(cursor: int | slice | torch.Tensor | Sequence[int], single: bool,
                 written: int, cap: int, storage: str) -> None:
    """``IndexError`` naming the rows when ``set(cursor, ...)`` (``single``: an int row) on a
    storage of ``cap`` rows, ``written`` of them written, writes past them with a gap: a row
    above ``written`` while some row from ``written`` up to it is not written too. Negative
    rows count from the written rows (never past them), and rows out of ``cap`` are left to
    the write, which names them. ``storage``: the storage's class name, for the message.

    Examples
    --------
    >>> check_no_gap(3, True, 3, 10, "LazyTensorStorage")  # the next row: no gap
    >>> check_no_gap(torch.tensor([4, 3]), False, 3, 10, "LazyTensorStorage")
    >>> check_no_gap(slice(5, 7), False, 3, 10, "LazyTensorStorage")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    IndexError: LazyTensorStorage is filled without gaps: cannot write rows [5, 6] while 3 ...
    """
    if written >= cap:  # (full: every row is written)
        return
    if single:
        row = int(cursor)  # type: ignore[arg-type]
        if written < row < cap:
            raise gap_error([row], written, storage)
        return
    if isinstance(cursor, slice):
        if cursor.step is None or cursor.step == 1:  # (what writers pass: a run of rows)
            start, stop = cursor.start, cursor.stop
            if start is not None and written < start < cap and (stop is None or stop > start):
                end = cap if stop is None or stop < 0 else min(stop, cap)
                raise gap_error(list(range(start, min(max(end, start + 1), start + 9))),
                                written, storage)
            return
        negative = any(b is not None and b < 0 for b in (cursor.start, cursor.stop))
        rows = range_tensor(range(*cursor.indices(written if negative else cap)))
    else:
        rows = as_long_tensor(cursor, name="cursor").reshape(-1)
    new = rows[(rows >= written) & (rows < cap)]
    if not new.numel():
        return
    new = new.unique()  # (sorted)
    if new.numel() != int(new[-1]) - written + 1:  # not every row from ``written`` to the top
        raise gap_error(new.tolist(), written, storage)


def gap_error(rows: list[int], written: int, storage: str) -> IndexError:
    """The ``IndexError`` of a write of ``rows`` (those past the ``written`` rows, sorted,
    without repeats; the first 9 of many) that would leave a gap after the written rows.

    Examples
    --------
    >>> str(gap_error([5], 3, "LazyTensorStorage"))  # doctest: +ELLIPSIS
    'LazyTensorStorage is filled without gaps: cannot write rows [5] while 3 rows are ...'
    """
    first = written  # the first row neither written nor in ``rows``
    for row in rows:
        if row != first:
            break
        first += 1
    last = min((row for row in rows if row > first), default=first + 1) - 1
    gap = f"row {first}" if last == first else f"rows {first} to {last}"
    shown = rows if len(rows) <= 8 else [*rows[:8], "..."]
    return IndexError(
        f"{storage} is filled without gaps: cannot write rows {shown} while {written} rows "
        f"are written: {gap} would be left unwritten, yet counted and sampled as data "
        f"(nothing was written). Write the rows from row {written} on (extend does).")
