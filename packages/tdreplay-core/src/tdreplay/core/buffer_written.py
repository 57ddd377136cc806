"""How a buffer tells of the rows a write filled (:class:`WrittenRowsMixin`, one of the rooms
:class:`~tdreplay.core.ReplayBuffer` is built from): its sampler (their slots, with the
priorities the batch brought) and the other buffers reading its storage; also the rows of a
write that an interrupt (``KeyboardInterrupt``, or what a signal handler raises) cut short,
which the writer completed before it propagates, so that every row counted can be sampled.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import torch

from .sampler import Sampler
from .storage import Storage
from .writer import Writer

__all__ = ["WrittenRowsMixin", "flat_slots", "one_slot_per_row"]


def flat_slots(slots: torch.Tensor) -> torch.Tensor:
    """``slots`` as one dim (a 1-dim tensor as it is: a ``reshape`` view costs a dispatch).

    >>> flat_slots(torch.tensor([[0, 2], [1, 3]])).tolist()
    [0, 2, 1, 3]
    """
    return slots if slots.ndim == 1 else slots.reshape(-1)


def one_slot_per_row(slots: torch.Tensor, rows: int) -> bool:
    """Whether a batch's ``rows`` rows went to ``slots`` one slot each (a 1-dim storage, and a
    writer that kept every row: not a max-value writer that kept some); ``rows < 0``: unknown.

    >>> one_slot_per_row(torch.tensor([4, 5]), 2), one_slot_per_row(torch.tensor([4]), 2)
    (True, False)
    """
    return slots.ndim == 1 and rows > 0 and slots.shape[0] == rows


class WrittenRowsMixin:
    """The telling of a write's rows (mixed into :class:`~tdreplay.core.ReplayBuffer`)."""

    _storage: Storage
    _sampler: Sampler
    _writer: Writer
    _readers: Any

    if TYPE_CHECKING:  # what the buffer this is mixed into provides (StorageReadersMixin)
        def _tell_readers_written(self, slots: Any) -> None: ...

    def _tell_written(self, rows: torch.Tensor, priority: Any = None, rows_given: int = -1
                      ) -> torch.Tensor:
        """Tell the sampler (and the buffers reading the storage) of the storage ``rows`` a
        write filled, with the checked ``priority`` of its ``rows_given`` rows if each went to
        one slot of its own; returns their slots."""
        slots = self._storage.rows_to_slots(rows)
        if priority is not None and one_slot_per_row(slots, rows_given):
            self._sampler.extend_with_priority(slots, priority, storage=self._storage)
        elif type(self._sampler).extend is not Sampler.extend and slots.numel():
            self._sampler.extend(flat_slots(slots))  # (the base's extend does nothing: not called)
        if self._readers.shared and slots.numel():  # other buffers read the storage
            self._tell_readers_written(slots)
        return slots

    def _tell_interrupted(self, rows: torch.Tensor | int | None, priority: Any = None,
                          rows_given: int = -1) -> None:
        """Before an exception that cut a write short propagates, tell the sampler of the rows
        written, as the write would have: every row counted can then be sampled. An interrupt
        (``KeyboardInterrupt``, or what a signal handler raises) lands wherever the
        interpreter is, e.g. between the writer's write and the sampler's ``extend``.
        ``rows``: what the writer returned; ``None`` when it raised (a writer completes a
        write cut short and holds its rows in :attr:`Writer.interrupted_rows`; none: it wrote
        nothing). A sampler that refuses the rows (its refusal was the exception) is left as
        it is."""
        if rows is None:
            rows, self._writer.interrupted_rows = self._writer.interrupted_rows, None
            if rows is None:
                return
        with contextlib.suppress(Exception):  # (the exception raised is the one that counts)
            self._tell_written(torch.as_tensor(rows, dtype=torch.long).reshape(-1), priority,
                               rows_given)
