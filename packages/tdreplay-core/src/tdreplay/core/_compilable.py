"""The ``compilable`` capability of storages: a written count ``torch.compile`` need not
specialize on."""

from __future__ import annotations

import torch


class CompilableCount:
    """Base of :class:`~tdreplay.core.Storage`: :meth:`written_slots_tensor`."""

    def written_slots_tensor(self) -> torch.Tensor | None:
        """The number of written slots as a 0-dim int64 CPU tensor, for storages that keep
        their count in a tensor (tensor storages built with ``compilable=True``), so that
        ``torch.compile``'d code reads it without specializing on its value; ``None`` (the
        default) for the others, whose count is ``len(storage)``.

        Examples
        --------
        >>> from tdreplay.core import ListStorage
        >>> ListStorage(4).written_slots_tensor() is None
        True
        """
        return None
