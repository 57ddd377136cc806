"""``TensorDictRoundRobinWriter``: round-robin writing that records each row's slot."""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDictBase

from tdreplay.core import RoundRobinWriter
from tdreplay.core.utils import ensure_tensordict


class TensorDictRoundRobinWriter(RoundRobinWriter):
    """A :class:`~tdreplay.core.RoundRobinWriter` for TensorDicts that stores ``index`` in rows.

    Each written row carries its own slot under ``"index"`` (as TorchRL's writer of the same
    name does), so data read back in physical order (``rb[:]``) knows where it lives. The
    caller's TensorDict is not modified: the entry is set on a shallow copy.

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> from tdreplay.core import ListStorage, ReplayBuffer
    >>> rb = ReplayBuffer(storage=ListStorage(3), writer=TensorDictRoundRobinWriter())
    >>> _ = rb.extend(TensorDict({"x": torch.arange(4)}, [4]))
    >>> rb[:]["x"].tolist(), rb[:]["index"].tolist()
    ([3, 1, 2], [0, 1, 2])
    """

    def _before_write(self, data: TensorDictBase, cursor: int | torch.Tensor, capacity: int,
                      batched: bool) -> TensorDictBase:
        """Shallow copy of ``data`` with the slots it is about to occupy under ``"index"``
        (``cursor``: the first row, or the rows themselves for ``write_at``)."""
        n = data.batch_size[0] if batched else 1
        rows = (cursor if isinstance(cursor, torch.Tensor)
                else (cursor + torch.arange(n)) % capacity)
        inner = data.batch_size[int(batched): int(batched) + self.storage.ndim - 1]
        numel = inner.numel()
        slots = (rows.reshape(-1, 1) * numel + torch.arange(numel)).reshape(rows.shape + inner)
        if not batched:
            slots = slots[0]
        data = data.copy()
        data.set("index", slots if data.device is None else slots.to(data.device))
        return data

    # TensorDicts (or tensorclasses, converted) only, checked before anything else
    def add(self, data: Any) -> int:
        return super().add(ensure_tensordict(data))

    def extend(self, data: Any) -> torch.Tensor:
        return super().extend(ensure_tensordict(data))
