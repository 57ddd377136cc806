"""``SamplerWithoutReplacement``: every written slot once per epoch."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from tdreplay.core import Sampler, Storage
from tdreplay.core.utils import check_batch_size, check_not_empty

__all__ = ["BatchLargerThanBufferError", "SamplerWithoutReplacement", "check_replacement"]


class BatchLargerThanBufferError(ValueError, RuntimeError):
    """A batch without replacement (``drop_last=True``) asked for more items than the buffer
    holds.

    A ``ValueError`` as in TorchRL, and a ``RuntimeError`` as tdreplay raised before.

    Examples
    --------
    >>> [issubclass(BatchLargerThanBufferError, e) for e in (ValueError, RuntimeError)]
    [True, True]
    """


def check_replacement(replacement: Any, owner: str, *, variant: bool) -> bool:
    """Check a sampler's ``replacement=`` argument (TorchRL's spelling of the choice between a
    sampler and its without-replacement variant) and return it as a bool.

    ``variant``: whether the sampler samples without replacement. A sampler with replacement
    that has no without-replacement variant refuses ``replacement=False`` with a
    ``TypeError`` (as TorchRL); a sampler without replacement refuses ``replacement=True``
    with a ``ValueError`` (TorchRL ignores it, which would sample otherwise than asked).

    Examples
    --------
    >>> check_replacement(False, "SamplerWithoutReplacement", variant=True)
    False
    >>> check_replacement(False, "PrioritizedSampler", variant=False)
    Traceback (most recent call last):
    ...
    TypeError: PrioritizedSampler has no without-replacement variant; ...
    """
    if not isinstance(replacement, (bool, np.bool_)):
        raise TypeError(f"replacement must be a bool, got {type(replacement).__name__}.")
    if variant and replacement:
        raise ValueError(f"{owner} samples without replacement: replacement=True contradicts "
                         "it (leave replacement out, or use the sampler with replacement).")
    if not variant and not replacement:
        raise TypeError(f"{owner} has no without-replacement variant; cannot be instantiated "
                        "with replacement=False.")
    return bool(replacement)


class SamplerWithoutReplacement(Sampler):
    """Draws each written slot exactly once per epoch, in shuffled (or storage) order.

    An epoch covers the slots written when it started; items written during an epoch join the
    next one. :attr:`ran_out` turns True with the batch that ends an epoch, which ends
    iteration over the buffer; the next ``sample`` starts a new epoch.

    Parameters
    ----------
    drop_last : bool
        Drop the last batch of an epoch when it would be smaller than ``batch_size``. The
        buffer must then be built with a ``batch_size`` (``ValueError`` otherwise, as TorchRL:
        :attr:`requires_batch_size`).
    shuffle : bool
        Shuffle each epoch (``False`` walks the slots in storage order).
    replacement : bool
        TorchRL's ``replacement=``: only ``False`` (what this sampler does) is accepted.

    Raises
    ------
    BatchLargerThanBufferError
        From :meth:`sample` with ``drop_last=True`` when the buffer holds fewer items than a
        batch (a ``ValueError`` and a ``RuntimeError``).

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

    def __init__(self, drop_last: bool = False, shuffle: bool = True, *,
                 replacement: bool = False) -> None:
        check_replacement(replacement, type(self).__name__, variant=True)
        self.drop_last = bool(drop_last)
        self.shuffle = bool(shuffle)
        self._order: torch.Tensor | None = None
        self._pos = 0
        self._ran_out = False

    def _start_epoch(self, n: int) -> None:
        self._order = torch.randperm(n, generator=self._rng) if self.shuffle else torch.arange(n)
        self._pos = 0
        self._ran_out = False

    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict[str, Any]]:
        check_batch_size(batch_size)
        n = check_not_empty(storage)
        if self.drop_last and n < batch_size:
            raise BatchLargerThanBufferError(
                f"The batch size ({batch_size}) is greater than the storage capacity ({n}): "
                "with drop_last=True no batch can be drawn without repeating items. Use a "
                "smaller batch, drop_last=False or a sampler with replacement.")
        remaining = 0 if self._order is None else self._order.numel() - self._pos
        if remaining == 0 or (self.drop_last and remaining < batch_size):
            self._start_epoch(n)
        perm = self._order
        assert perm is not None  # set by _start_epoch
        index = perm[self._pos: self._pos + batch_size]
        self._pos += index.numel()
        remaining = perm.numel() - self._pos
        self._ran_out = remaining == 0 or (self.drop_last and remaining < batch_size)
        return index, {}

    @property
    def ran_out(self) -> bool:
        return self._ran_out

    @property
    def requires_batch_size(self) -> bool:
        """``drop_last``: only a known batch size tells which last batch is incomplete, so a
        buffer built without ``batch_size`` refuses this sampler with ``drop_last=True``."""
        return self.drop_last

    def empty(self) -> None:
        self._order = None
        self._pos = 0
        self._ran_out = False

    def state_dict(self) -> dict[str, Any]:
        return {
            "perm": torch.empty(0, dtype=torch.long) if self._order is None
            else self._order.clone(),
            "has_perm": self._order is not None,
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
        self._order = perm.clone() if state_dict["has_perm"] else None
        self._pos = pos
        self._ran_out = bool(state_dict["ran_out"])

    def __repr__(self) -> str:
        return f"{type(self).__name__}(drop_last={self.drop_last}, shuffle={self.shuffle})"
