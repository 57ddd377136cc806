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
        return _stamped(data, slots if batched else slots[0])

    def prepare_assignment(self, value: Any, slots: torch.Tensor) -> Any:
        """``rb[index] = value`` writes the slots it covers under ``"index"`` too, as
        ``extend`` does (a value copied from another row, ``rb[0] = rb[1]``, gets its new
        slot; a value without the entry gets it), on a storage with ``ndim == 1``. A
        TensorDict whose batch does not have one item per slot is refused (``ValueError``
        naming ``value``), nothing written.

        Examples
        --------
        >>> from tensordict import TensorDict
        >>> from tdreplay.core import ListStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=ListStorage(3), writer=TensorDictRoundRobinWriter())
        >>> _ = rb.extend(TensorDict({"x": torch.arange(3)}, [3]))
        >>> rb[0] = rb[2]
        >>> rb[:]["x"].tolist(), rb[:]["index"].tolist()
        ([2, 1, 2], [0, 1, 2])
        """
        if not isinstance(value, TensorDictBase) or self.storage.ndim > 1:
            # (not a TensorDict: the storage refuses it; ndim > 1: the assignment goes along
            # dim_extend, and the value keeps its entries as given)
            return value
        if value.batch_size.numel() != slots.numel():
            raise ValueError(f"value has batch size {list(value.batch_size)}, but the index "
                             f"covers {slots.numel()} slots: a TensorDictRoundRobinWriter "
                             "stamps one 'index' per slot, so give one item per slot.")
        return _stamped(value, slots.reshape(value.batch_size))

    # TensorDicts (or tensorclasses, converted) only, checked before anything else
    def add(self, data: Any) -> int:
        return super().add(ensure_tensordict(data))

    def extend(self, data: Any) -> torch.Tensor:
        return super().extend(ensure_tensordict(data))


def _stamped(data: TensorDictBase, slots: torch.Tensor) -> TensorDictBase:
    """Shallow copy of ``data`` with ``slots`` (shaped like its batch) under ``"index"``."""
    data = data.copy()
    data.set("index", slots if data.device is None else slots.to(data.device))
    return data
