"""``TensorDictRoundRobinWriter``: round-robin writing that records each row's slot."""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDictBase, is_tensorclass

from tdreplay.core import RoundRobinWriter
from tdreplay.core.utils import ensure_tensordict


class TensorDictRoundRobinWriter(RoundRobinWriter):
    """A :class:`~tdreplay.core.RoundRobinWriter` for TensorDicts that stores ``index`` in rows.

    Each written row carries its own slot under ``"index"`` (as TorchRL's writer of the same
    name does), so data read back in physical order (``rb[:]``) knows where it lives. The
    caller's TensorDict is not modified: the entry is set on a shallow copy. Items with batch
    dims of their own (``extend`` of a ``[B, 2]`` TensorDict into a storage of ``ndim == 1``,
    ``add`` of a ``[2]`` one) get their slot over all of them, as TorchRL's (``index`` of item
    ``i`` is ``[i, i]``); in a storage of ``ndim > 1`` each step of a row gets its own slot.

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> from tdreplay.core import ListStorage, ReplayBuffer
    >>> rb = ReplayBuffer(storage=ListStorage(3), writer=TensorDictRoundRobinWriter())
    >>> _ = rb.extend(TensorDict({"x": torch.arange(4)}, [4]))
    >>> rb[:]["x"].tolist(), rb[:]["index"].tolist()
    ([3, 1, 2], [0, 1, 2])
    >>> rb = ReplayBuffer(storage=ListStorage(3), writer=TensorDictRoundRobinWriter())
    >>> _ = rb.extend(TensorDict({"x": torch.zeros(2, 2)}, [2, 2]))  # 2 items of batch [2]
    >>> rb[:]["index"].tolist()
    [[0, 0], [1, 1]]
    """

    def prepare_write(self, data: TensorDictBase, cursor: int | torch.Tensor, capacity: int,
                      batched: bool) -> TensorDictBase:
        """Shallow copy of ``data`` with the slots it is about to occupy under ``"index"``
        (``cursor``: the first row, or the rows themselves for ``write_at``): one slot per
        row, per step of a row in a storage of ``ndim > 1``, expanded over the dims an item
        has beyond those (as TorchRL's ``expand_as_right``). A tensorclass is written as it
        is, as TorchRL's: its fields are its class's, and ``index`` is none of them."""
        if is_tensorclass(data):
            return data
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
        slot; a value without the entry gets it), on a storage with ``ndim == 1``. Items with
        batch dims of their own get their slot over those dims (``rb[0] = item`` of batch
        ``[2]`` stamps ``[0, 0]``): the leading dims of the value's batch that hold one item
        per slot take the slots, the dims after them the slot of their item. A TensorDict
        whose leading dims do not hold one item per slot is refused (``ValueError`` naming
        ``value``), nothing written.

        Examples
        --------
        >>> from tensordict import TensorDict
        >>> from tdreplay.core import ListStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=ListStorage(3), writer=TensorDictRoundRobinWriter())
        >>> _ = rb.extend(TensorDict({"x": torch.arange(3)}, [3]))
        >>> rb[0] = rb[2]
        >>> rb[:]["x"].tolist(), rb[:]["index"].tolist()
        ([2, 1, 2], [0, 1, 2])
        >>> rb = ReplayBuffer(storage=ListStorage(3), writer=TensorDictRoundRobinWriter())
        >>> _ = rb.extend(TensorDict({"x": torch.zeros(2, 2)}, [2, 2]))
        >>> rb[1] = TensorDict({"x": torch.ones(2)}, [2])  # one item of batch [2]
        >>> rb[:]["index"].tolist()
        [[0, 0], [1, 1]]
        """
        if not isinstance(value, TensorDictBase) or self.storage.ndim > 1:
            # (not a TensorDict: the storage refuses it; ndim > 1: the assignment goes along
            # dim_extend, and the value keeps its entries as given)
            return value
        batch = value.batch_size
        # the fewest leading dims holding one item per slot (any more of them are of size 1,
        # and stamp the same values)
        lead = next((k for k in range(len(batch) + 1) if batch[:k].numel() == slots.numel()),
                    None)
        if lead is None:
            raise ValueError(f"value has batch size {list(batch)}, but the index covers "
                             f"{slots.numel()} slots: a TensorDictRoundRobinWriter stamps one "
                             "'index' per slot, so give one item per slot (leading dims of "
                             "value's batch holding that many items).")
        return _stamped(value, slots.reshape(batch[:lead]))

    # TensorDicts (or tensorclasses, written without the entry) only, checked before anything
    def add(self, data: Any) -> int:
        return super().add(ensure_tensordict(data))

    def extend(self, data: Any) -> torch.Tensor:
        return super().extend(ensure_tensordict(data))


def _stamped(data: TensorDictBase, slots: torch.Tensor) -> TensorDictBase:
    """Shallow copy of ``data`` with ``slots`` under ``"index"``: ``slots`` is shaped like the
    leading dims of its batch, and expanded over the others (each item's own dims, as
    TorchRL's ``expand_as_right``; a copy, so a stored row owns its entry)."""
    extra = data.batch_dims - slots.ndim
    if extra > 0 and slots.shape == data.batch_size[:slots.ndim]:
        slots = slots.reshape(slots.shape + (1,) * extra).expand(data.batch_size).contiguous()
    data = data.copy()
    data.set("index", slots if data.device is None else slots.to(data.device))
    return data
