"""Where a :class:`~tdreplay.storages.StoreStorage` reads and writes on its server: rows and
slots checked against the capacity and the written rows, contiguous ones as one range (one
request to the server)."""

from __future__ import annotations

from typing import Any

from tdreplay.core.storage import written_slots
from tdreplay.core.utils import as_long_tensor, is_int, range_tensor

__all__ = ["read_index", "write_index"]


def write_index(rows: Any, n: int | None, max_size: int) -> tuple[Any, int, int]:
    """``(index for the store, highest row, last row)`` of ``rows`` of a store of ``max_size``
    rows; ``IndexError`` naming ``rows`` for rows outside ``[0, max_size)`` and ``ValueError``
    when their number is not ``n`` (the rows of data).

    Examples
    --------
    >>> import torch
    >>> write_index(torch.tensor([2, 3, 4]), 3, 10), write_index(7, None, 10)
    ((slice(2, 5, None), 4, 4), (7, 7, 7))
    """
    if is_int(rows):
        row = int(rows)
        if not 0 <= row < max_size:
            raise IndexError(f"rows {row} is out of range for a StoreStorage of max_size "
                             f"{max_size}.")
        return row, row, row
    if isinstance(rows, slice):
        start, stop, step = rows.indices(max_size)
        tensor = range_tensor(range(start, stop, step))
        if rows.stop is not None and rows.stop > max_size:
            raise IndexError(f"rows {rows} reaches past max_size={max_size}.")
    else:
        tensor = as_long_tensor(rows, name="rows").reshape(-1)
    if n is not None and tensor.numel() != n:
        raise ValueError(f"rows selects {tensor.numel()} rows but data holds {n}.")
    if not tensor.numel():
        return tensor, -1, -1
    lo, hi = int(tensor.min()), int(tensor.max())
    if lo < 0 or hi >= max_size:
        raise IndexError(f"rows must lie in [0, {max_size}), got values in "
                         f"[{lo}, {hi}].")
    first, last = int(tensor[0]), int(tensor[-1])
    if last - first == tensor.numel() - 1 and bool((tensor.diff() == 1).all()):
        return slice(first, last + 1), hi, last  # one range on the server
    return tensor, hi, last


def read_index(slots: Any, n: int, capacity: int | None = None) -> Any:
    """The store index of ``slots`` of a store of ``n`` written rows out of ``capacity``
    (contiguous slots as one range; masks as :func:`~tdreplay.core.storage.written_slots`
    reads them); ``IndexError`` for slots not written.

    Examples
    --------
    >>> import torch
    >>> read_index(torch.tensor([1, 2, 3]), 5), read_index(torch.tensor([3, 1]), 5)
    (slice(1, 4, None), tensor([3, 1]))
    """
    if is_int(slots):
        slot = int(slots)
        if not -n <= slot < n:
            raise IndexError(f"slot {slot} is not written ({n} rows are).")
        return slot % n  # (-1: the last written slot)
    if isinstance(slots, slice):
        start, stop, step = slots.indices(n)
        if step == 1:
            return slice(start, max(start, stop))
        return range_tensor(range(start, stop, step))
    slots = written_slots(slots, n, capacity)  # (a mask; negative slots: from the end)
    if slots.ndim == 1 and slots.numel() > 1:
        first, last = int(slots[0]), int(slots[-1])
        if last - first == slots.numel() - 1 and bool((slots.diff() == 1).all()):
            return slice(first, last + 1)
    return slots.cpu()
