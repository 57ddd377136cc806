"""What a batch of slices carries besides its slots: the truncation flags, the ``is_init`` marks
of slice starts and, with ``pad_output``, the padding of short slices and their mask.

Pure functions over the flat slots of slices laid end to end and the place of each slice's
last step (``ends``), shared by the slice samplers.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tensordict import unravel_key

from ._storage_entries import StorageEntries

__all__ = ["INIT_KEY", "MASK_KEY", "check_init_key", "mark_starts", "pad_slices", "slice_info",
           "truncation_info"]

#: Stored entry marking the first step of a trajectory (TorchRL's ``InitTracker``); samples
#: get it set at every slice start too.
INIT_KEY = "is_init"
#: Info entry of padded samples: ``True`` at real steps, ``False`` at padding.
MASK_KEY = ("collector", "mask")


def check_init_key(init_key: Any) -> Any:
    """A slice sampler's ``init_key`` argument: a key (unravelled) or ``None``; a
    ``TypeError`` naming the argument otherwise.

    Examples
    --------
    >>> check_init_key(("a", ("b",))), check_init_key(None)
    (('a', 'b'), None)
    >>> check_init_key(3)
    Traceback (most recent call last):
    ...
    TypeError: init_key must be a key (a str or a tuple of str) or None, got 3.
    """
    if init_key is None:
        return None
    try:
        return unravel_key(init_key)
    except Exception as err:
        raise TypeError(f"init_key must be a key (a str or a tuple of str) or None, got "
                        f"{init_key!r}.") from err


def pad_slices(slots: torch.Tensor, ends: np.ndarray, seq_len: int
               ) -> tuple[torch.Tensor, np.ndarray, torch.Tensor]:
    """Every slice padded to ``seq_len`` steps by repeating its last real slot (TorchRL's
    ``pad_output``). Returns the slots, the place of each slice's last *real* step and the
    mask of real steps (bool, one per slot).

    Examples
    --------
    >>> slots, ends, mask = pad_slices(torch.tensor([7, 8, 3]), np.array([1, 2]), 3)
    >>> slots.tolist(), ends.tolist(), mask.tolist()
    ([7, 8, 8, 3, 3, 3], [1, 3], [True, True, False, True, False, False])
    """
    lengths = np.diff(ends, prepend=-1)
    first = ends - lengths + 1
    steps = np.arange(seq_len)
    real = steps[None, :] < lengths[:, None]
    source = first[:, None] + np.minimum(steps[None, :], lengths[:, None] - 1)
    padded = slots[torch.from_numpy(source.reshape(-1))]
    return padded, np.arange(ends.size) * seq_len + lengths - 1, torch.from_numpy(real.reshape(-1))


def mark_starts(entries: StorageEntries, storage: Any, slots: torch.Tensor, starts: np.ndarray,
                key: Any = INIT_KEY) -> torch.Tensor | None:
    """The stored ``is_init`` (entry ``key``) of ``slots``, also ``True`` at ``starts`` (the
    place of the first step of every slice), so a
    recurrent module splitting a flat sample on ``is_init`` starts each slice anew (TorchRL
    does the same). ``None`` when the storage has no such entry: no reset is made up.

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> from tdreplay.storages import LazyTensorStorage
    >>> storage = LazyTensorStorage(4)
    >>> storage.set(torch.arange(4), TensorDict({"is_init": torch.tensor([[True], [False],
    ...                                                                 [False], [False]])}, [4]))
    >>> marks = mark_starts(StorageEntries(), storage, torch.tensor([0, 1, 2, 3]), np.array([0, 3]))
    >>> marks.view(-1).tolist()
    [True, False, False, True]
    """
    stored = entries.gather(storage, key, slots)
    if stored is None:
        return None
    marks = torch.zeros(stored.shape[0], dtype=torch.bool, device=stored.device)
    marks[torch.from_numpy(starts).to(stored.device)] = True
    return marks.view(-1, *(1,) * (stored.ndim - 1)) | (stored if stored.dtype is torch.bool
                                                         else stored != 0)


def truncation_info(entries: StorageEntries, storage: Any, slots: torch.Tensor,
                    ends: np.ndarray, truncated_key: Any, done_keys: tuple[Any, Any]
                    ) -> dict[Any, torch.Tensor]:
    """``truncated`` (True at each slice end), ``done`` (stored, or the truncation) and
    ``terminated`` of the batch, under ``truncated_key`` and ``done_keys`` (none without a
    ``truncated_key``)."""
    if truncated_key is None:
        return {}
    done_key, terminated_key = done_keys
    n = slots.numel()
    done = entries.gather(storage, done_key, slots)
    flags = np.zeros(n, dtype=np.bool_)
    flags[ends] = True
    shape = (n, *(1,) * (done.ndim - 1)) if done is not None else (n, 1)
    truncated = torch.from_numpy(flags).view(shape)
    if done is not None:
        truncated = truncated.to(done.device)
        done = (done if done.dtype is torch.bool else done != 0) | truncated
    else:
        done = truncated.clone()
    terminated = entries.gather(storage, terminated_key, slots)
    if terminated is None:
        terminated = torch.zeros_like(truncated)
    return {truncated_key: truncated, done_key: done, terminated_key: terminated}


def slice_info(entries: StorageEntries, storage: Any, slots: torch.Tensor, ends: np.ndarray,
               *, truncated_key: Any, done_keys: tuple[Any, Any], pad_to: int | None = None,
               init_key: Any = INIT_KEY) -> tuple[torch.Tensor, dict[Any, torch.Tensor]]:
    """The slots of a batch of slices (padded to ``pad_to`` steps each when given) and its
    info: truncation flags, ``is_init`` marks under ``init_key`` (none when ``None``) and,
    padded, the mask of real steps."""
    info: dict[Any, torch.Tensor] = {}
    if pad_to is not None:
        slots, ends, info[MASK_KEY] = pad_slices(slots, ends, pad_to)
        starts = np.arange(ends.size) * pad_to
    else:
        starts = np.concatenate([[0], ends[:-1] + 1]).astype(np.int64)
    info.update(truncation_info(entries, storage, slots, ends, truncated_key, done_keys))
    marks = None if init_key is None else mark_starts(entries, storage, slots, starts, init_key)
    if marks is not None:
        info[init_key] = marks
    return slots, info
