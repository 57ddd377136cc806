"""``SamplerWithoutReplacement``: every written slot once per epoch."""

from __future__ import annotations

from typing import Any

import torch

from tdreplay.core import Sampler, Storage
from tdreplay.core.utils import check_batch_size, check_not_empty


class SamplerWithoutReplacement(Sampler):
    """Draws each written slot exactly once per epoch, in shuffled (or storage) order.

    An epoch covers the slots written when it started; items written during an epoch join the
    next one. :attr:`ran_out` turns True with the batch that ends an epoch, which ends
    iteration over the buffer; the next ``sample`` starts a new epoch.

    Parameters
    ----------
    drop_last : bool
        Drop the last batch of an epoch when it would be smaller than ``batch_size``.
    shuffle : bool
        Shuffle each epoch (``False`` walks the slots in storage order).

    Examples
    --------
    >>> from tdreplay.core import ListStorage
    >>> s = ListStorage(10)
    >>> s.set(torch.arange(5), list("abcde"))
    >>> sampler = SamplerWithoutReplacement(shuffle=False)
    >>> [sampler.sample(s, 2)[0].tolist() for _ in range(3)], sampler.ran_out
    ([[0, 1], [2, 3], [4]], True)
    """

    finite_epochs = True

    def __init__(self, drop_last: bool = False, shuffle: bool = True) -> None:
        self.drop_last = bool(drop_last)
        self.shuffle = bool(shuffle)
        self._perm: torch.Tensor | None = None
        self._pos = 0
        self._ran_out = False

    def _new_epoch(self, n: int) -> None:
        self._perm = torch.randperm(n, generator=self._rng) if self.shuffle else torch.arange(n)
        self._pos = 0
        self._ran_out = False

    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict[str, Any]]:
        check_batch_size(batch_size)
        n = check_not_empty(storage)
        if self.drop_last and n < batch_size:
            raise RuntimeError(f"drop_last=True but the buffer holds {n} items, fewer than one "
                               f"batch of {batch_size}.")
        remaining = 0 if self._perm is None else self._perm.numel() - self._pos
        if remaining == 0 or (self.drop_last and remaining < batch_size):
            self._new_epoch(n)
        perm = self._perm
        assert perm is not None  # set by _new_epoch
        index = perm[self._pos: self._pos + batch_size]
        self._pos += index.numel()
        remaining = perm.numel() - self._pos
        self._ran_out = remaining == 0 or (self.drop_last and remaining < batch_size)
        return index, {}

    @property
    def ran_out(self) -> bool:
        return self._ran_out

    def empty(self) -> None:
        self._perm = None
        self._pos = 0
        self._ran_out = False

    def state_dict(self) -> dict[str, Any]:
        return {
            "perm": torch.empty(0, dtype=torch.long) if self._perm is None else self._perm.clone(),
            "has_perm": self._perm is not None,
            "pos": self._pos,
            "ran_out": self._ran_out,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.check_state_dict(state_dict)
        perm = state_dict["perm"]
        if not isinstance(perm, torch.Tensor) or perm.dtype != torch.long:
            raise ValueError("SamplerWithoutReplacement state_dict 'perm' must be an int64 tensor.")
        pos = int(state_dict["pos"])
        if not 0 <= pos <= perm.numel():
            raise ValueError(
                f"state_dict 'pos'={pos} is outside the epoch of {perm.numel()} slots.")
        self._perm = perm.clone() if state_dict["has_perm"] else None
        self._pos = pos
        self._ran_out = bool(state_dict["ran_out"])

    def __repr__(self) -> str:
        return f"{type(self).__name__}(drop_last={self.drop_last}, shuffle={self.shuffle})"
