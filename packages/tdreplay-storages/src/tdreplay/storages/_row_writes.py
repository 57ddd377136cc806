"""The write path of a :class:`~._layout.TensorLayout` (functions of a layout, which binds
:func:`write_rows` as its ``write``; no storage imports): data written at an int row, a slice
or row indices (:func:`write_rows`), a run of rows copied as it comes when it is as expected
(:func:`write_run`), and the rows of a layout allocated unfilled zeroed before a write would
leave them behind (:func:`before_write`). The copies are the layout's own
(:meth:`~._layout.TensorLayout.copy_rows`, :meth:`~._layout.TensorLayout.index_copy_rows`), the
checks its :attr:`~._layout.TensorLayout.sources`'.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDictBase

from tdreplay.core.utils import as_long_tensor, range_tensor

if TYPE_CHECKING:
    from ._layout import TensorLayout

__all__ = ["before_write", "cursor_rows", "slice_bound", "write_rows", "write_run"]


def write_rows(layout: TensorLayout, rows: Any, td: TensorDictBase,
               leaves: list[torch.Tensor] | None, single: bool,
               written: int | None = None) -> tuple[int | None, int | None]:
    """Write ``td`` at ``rows`` of ``layout`` (one item at an int row, else a batch at a slice
    or at row indices) after checking it (its ``source_leaves``, with ``leaves`` of its
    ``matching_leaves`` if known). Negative rows count from the ``written`` rows (``None``:
    all of them, a full storage), as ``get(-1)`` counts them: ``-1`` is the last written row,
    never a row past it. Returns ``(top, last)``: the row count the write reaches (``None``
    when it writes no row) and the row written last (``None``: none).

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> from tdreplay.storages._layout import TensorLayout
    >>> layout = TensorLayout(TensorDict({"a": torch.zeros(5)}, [5]), ndim=1,
    ...                       device=torch.device("cpu"))
    >>> layout.write(torch.tensor([3, -5]), TensorDict({"a": torch.ones(2)}, [2]), None,
    ...              single=False)
    (4, 0)
    >>> layout.leaves[0].tolist()
    [1.0, 0.0, 0.0, 1.0, 0.0]
    """
    cap = layout.rows
    base = cap if written is None else written
    if single:
        row = int(rows)
        if not -base <= row < cap:
            raise _out_of_range(row, cap, base, f"row {row} out of range for a storage of "
                                                f"{cap} rows.")
        if row < 0:
            row += base
        write_run(layout, row, row + 1, td, leaves, lead=layout.inner)
        return row + 1, row
    if isinstance(rows, slice):
        # (full: every bound counts from the end, no call on the hot path)
        start, stop, step = rows.indices(cap if base == cap else slice_bound(rows, cap, base))
        if step != 1:
            rows = range_tensor(range(start, stop, step))
        else:
            stop = max(stop, start)  # (an empty slice, e.g. [7:1]: no row)
            write_run(layout, start, stop, td, leaves)
            return (stop, stop - 1) if stop > start else (None, None)
    rows, top = _rows_in_range(as_long_tensor(rows, name="rows").reshape(-1), cap, base)
    src = layout.source_leaves(td, (rows.numel(), *layout.inner), leaves)
    before_write(layout, top + 1, top + 1)  # rows in any order: all below the top one
    layout.index_copy_rows(rows.to(layout.device), src)
    return (top + 1, int(rows[-1])) if rows.numel() else (None, None)


def write_run(layout: TensorLayout, start: int, stop: int, td: TensorDictBase,
              leaves: list[torch.Tensor] | None, lead: tuple[int, ...] | None = None) -> None:
    """Write the batch ``td`` (``leaves``: of ``layout.matching_leaves``, if known) at rows
    ``[start, stop)`` of ``layout``, checked as its ``source_leaves`` checks it. ``lead``: the
    shape before each leaf's own dims (``[stop - start, *inner]`` by default; ``inner`` for one
    item without a leading dim at ``stop == start + 1``).

    The common write (the storage's keys, dtypes and shapes, on the host) is checked by
    the numpy copy itself (``layout.copy_rows`` with the shapes it must have); anything
    else is checked and named by ``layout.source_leaves`` first.

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> from tdreplay.storages._layout import TensorLayout
    >>> layout = TensorLayout(TensorDict({"a": torch.zeros(4, 2)}, [4]), ndim=1,
    ...                       device=torch.device("cpu"))
    >>> batch = TensorDict({"a": torch.ones(2, 2)}, [2])
    >>> write_run(layout, 1, 3, batch, layout.matching_leaves(batch))
    >>> layout.leaves[0][:, 0].tolist()
    [0.0, 1.0, 1.0, 0.0]
    >>> narrow = TensorDict({"a": torch.ones(2, 1)}, [2])
    >>> write_run(layout, 0, 2, narrow, None)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    tdreplay.core.utils.ShapeMismatchError: entry 'a' has shape (2, 1), expected (2, 2) for ...
    """
    if lead is None:
        lead = (stop - start, *layout.inner)
    if leaves is not None:
        _, shapes = layout.sources.expected_for(lead)
        if layout.copy_rows(start, stop, leaves, shapes):
            before_write(layout, start, stop)  # (rows below ``start`` only: in any order)
            return
    src = layout.source_leaves(td, lead, leaves)
    before_write(layout, start, stop)
    layout.copy_rows(start, stop, src)


def before_write(layout: TensorLayout, start: int, stop: int) -> None:
    """Rows ``[start, stop)`` of ``layout`` are about to be written: in a layout allocated
    unfilled (its ``unfilled_from`` set), zero the never-written rows below ``start`` the write
    would leave behind, so that every row below the written count holds data or zeros.

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> from tdreplay.storages._layout import TensorLayout
    >>> layout = TensorLayout(TensorDict({"a": torch.full((6,), 9)}, [6]), ndim=1,
    ...                       device=torch.device("cpu"))
    >>> layout.unfilled_from = 0  # as if allocated unfilled: nothing written yet
    >>> before_write(layout, 3, 4)
    >>> layout.leaves[0].tolist(), layout.unfilled_from
    ([0, 0, 0, 9, 9, 9], 4)
    >>> before_write(layout, 5, 6)  # the top row: rows 4 zeroed, none left unfilled
    >>> layout.leaves[0].tolist(), layout.unfilled_from
    ([0, 0, 0, 9, 0, 9], None)
    """
    low = layout.unfilled_from
    if low is None or stop <= low:
        return
    if start > low:
        for leaf in layout.leaves:
            leaf[low:start].zero_()
    # every row written or zeroed once the top one is: no check on later writes
    layout.unfilled_from = stop if stop < layout.rows else None


def cursor_rows(rows: Any, cap: int, written: int) -> int:
    """How many rows :func:`write_rows` writes at ``rows`` (a slice, or row indices) of a
    layout of ``cap`` rows with ``written`` rows written, counted as it counts them.

    Examples
    --------
    >>> cursor_rows(slice(1, 3), 10, 5), cursor_rows(slice(-2, None), 10, 5)
    (2, 2)
    >>> cursor_rows([0, 4, 4], 10, 5), cursor_rows(slice(7, 1), 10, 5)
    (3, 0)
    """
    if isinstance(rows, slice):
        return len(range(*rows.indices(cap if written == cap else slice_bound(rows, cap, written))))
    return as_long_tensor(rows, name="rows").numel()


def slice_bound(rows: slice, cap: int, written: int) -> int:
    """The length ``rows`` (a slice) is taken of: the ``written`` rows when a bound of it is
    negative (``[-2:]``: the last two written rows), else the ``cap`` rows (a slice past the
    written rows writes new ones)."""
    negative = (rows.start is not None and rows.start < 0) or \
        (rows.stop is not None and rows.stop < 0)
    return written if negative else cap


def _out_of_range(value: int, cap: int, written: int, message: str) -> IndexError:
    """The ``IndexError`` of row ``value``: ``message``, or for a negative row before the first
    written one of a storage that is not full, one saying the rows count from the written."""
    if value < 0 and written < cap:
        return IndexError(f"cursor {value} is out of range: the storage holds {written} "
                          "written rows (negative rows count from them).")
    return IndexError(message)


def _rows_in_range(rows: torch.Tensor, cap: int, written: int) -> tuple[torch.Tensor, int]:
    """``rows`` (1-D) checked against ``cap`` rows, negative ones counted from the ``written``
    rows, and the highest row (``-1`` for no rows)."""
    if not rows.numel():
        return rows, -1
    lo, top = (int(v) for v in torch.aminmax(rows))  # one pass for the check and the top row
    if top >= cap or lo < -written:
        raise _out_of_range(lo if lo < -written else top, cap, written,
                            f"rows out of range for a storage of {cap} rows.")
    if lo < 0:  # negative rows count from the written rows (from the end once full)
        rows = torch.where(rows < 0, rows + written, rows)
        top = int(rows.max())
    return rows, top
