"""Write generations of a storage's rows: how many times each row was (re)written.

A consumer that holds an index (from ``extend`` or ``sample``) can tell whether the row still
holds what it saw: it compares the generation it captured with the current one (see
:meth:`~tdreplay.core.ReplayBuffer.update_if_present`). The table belongs to the *storage*
(:attr:`~tdreplay.core.Storage.slot_generations`), not to a writer: two buffers sharing one
storage overwrite each other's rows, and each must see the other's writes. A writer built with
``track_generations=True`` creates the table; every :class:`~tdreplay.core.RoundRobinWriter`
advances an existing one when it writes, and every writer's ``empty`` invalidates it.

``-1`` means "never written" (or "no usable stamp"); the first write of a row gives 0.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["SlotGenerations", "after_stamps_of", "check_generation_table"]


def check_generation_table(value: Any, capacity: int | None, owner: str) -> torch.Tensor:
    """``value`` as a 1-D int64 CPU tensor of stamps >= -1 (at most ``capacity`` long when
    known); ``ValueError`` naming ``owner``'s ``state_dict['generation']`` otherwise."""
    where = f"{owner} state_dict['generation']"
    if not isinstance(value, torch.Tensor) or value.dtype != torch.int64 or value.ndim != 1:
        raise ValueError(f"{where} must be a 1-D int64 tensor, got "
                         f"{getattr(value, 'dtype', type(value).__name__)} of shape "
                         f"{tuple(getattr(value, 'shape', ()))}.")
    if value.numel() and int(value.min()) < -1:
        raise ValueError(f"{where} holds {int(value.min())}: stamps are >= -1.")
    if capacity is not None and value.numel() > capacity:
        raise ValueError(f"{where} has {value.numel()} rows but the storage holds "
                         f"{capacity}.")
    return value.detach().to("cpu", copy=True)


def after_stamps_of(current: SlotGenerations, table: torch.Tensor) -> torch.Tensor:
    """The stamps of ``table`` (a restored one) for the rows ``current`` (the table they
    replace) stamped: past the row's current stamp (a restore rewrites the row), so that no
    handle taken before the restore matches it, as after :meth:`SlotGenerations.invalidate`;
    a saved stamp that is already past it stays (handles of the saved buffer's records keep
    matching). Rows ``current`` never stamped keep the saved stamps. One more per restore,
    whatever the number of restores.

    Examples
    --------
    >>> live = SlotGenerations(torch.tensor([3, 0, -1]))
    >>> after_stamps_of(live, torch.tensor([0, 2, -1, 1])).tolist()
    [4, 2, -1, 1]
    """
    live = current.table
    size = max(live.numel(), table.numel())
    saved = torch.full((size,), -1, dtype=torch.int64)
    saved[:table.numel()] = table
    now = torch.full((size,), -1, dtype=torch.int64)
    now[:live.numel()] = live
    return torch.where(now >= 0, torch.maximum(saved, now + 1), saved)


class SlotGenerations:
    """The write generation of every row of one storage (``-1``: never written).

    The table lives on the CPU and grows (at least doubling, at most to ``capacity``) as rows
    are written; a read of a row it does not cover reports ``-1``.

    Examples
    --------
    >>> gens = SlotGenerations()
    >>> gens.bump(torch.tensor([0, 1, 2, 0]), capacity=4)
    >>> gens.of(torch.arange(5)).tolist()
    [1, 0, 0, -1, -1]
    >>> gens.invalidate()
    >>> gens.of(torch.arange(4)).tolist()
    [2, 1, 1, -1]
    """

    def __init__(self, table: torch.Tensor | None = None) -> None:
        self._table = (torch.full((0,), -1, dtype=torch.int64) if table is None
                       else table.to("cpu", torch.int64).clone())

    @property
    def table(self) -> torch.Tensor:
        """A copy of the stamps, one per row covered so far."""
        return self._table.clone()

    def bump(self, rows: torch.Tensor, capacity: int | None = None) -> None:
        """Advance the generation of ``rows`` by one per occurrence (a row written twice by
        one ``extend`` advances twice)."""
        rows = torch.as_tensor(rows, dtype=torch.long).reshape(-1).cpu()
        if not rows.numel():
            return
        needed = int(rows.max()) + 1
        current = self._table.numel()
        if needed > current:
            size = max(needed, 2 * current, 16)
            if capacity is not None:
                size = max(min(size, capacity), needed)
            grown = torch.full((size,), -1, dtype=torch.int64)
            grown[:current] = self._table
            self._table = grown
        self._table.index_put_((rows,), torch.ones_like(rows), accumulate=True)

    def of(self, rows: torch.Tensor) -> torch.Tensor:
        """Stamps of ``rows`` (any shape, on any device; the result has its shape and
        device); ``-1`` for rows never written or outside the table."""
        rows = torch.as_tensor(rows, dtype=torch.long)
        flat = rows.reshape(-1).cpu()
        n = self._table.numel()
        out = torch.full(flat.shape, -1, dtype=torch.int64)
        valid = (flat >= 0) & (flat < n)
        out[valid] = self._table[flat[valid]]
        return out.reshape(rows.shape).to(rows.device)

    def invalidate(self) -> None:
        """Advance every written row (the storage was emptied: no handle is live any more);
        never-written rows stay ``-1``. Stamps only grow, so an old handle never looks live
        again."""
        self._table[self._table >= 0] += 1

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rows={self._table.numel()})"
