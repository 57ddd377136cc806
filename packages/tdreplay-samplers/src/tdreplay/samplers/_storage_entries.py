"""Reading single entries (trajectory ids, done flags) of a storage's steps by flat slot."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tensordict import LazyStackedTensorDict, is_tensor_collection, unravel_key

from tdreplay.core import ListStorage
from tdreplay.core.utils import check_whole_numbers


class MissingKeyError(KeyError):
    """A ``KeyError`` whose message prints as written (not as a quoted repr)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def key_name(key: Any) -> str:
    """A key as users write it (``"a"`` or ``("next", "done")``)."""
    key = unravel_key(key)
    return repr(key)


class StorageEntries:
    """Flat per-slot access to entries of the TensorDicts a storage holds.

    Tensor storages expose their written rows as a TensorDict view (``storage[:]``); its
    leaves, flattened over the storage dimensions, are views indexed by flat slot, so nothing
    is copied until a block or a batch of slots is read. List storages are read item by item.
    The views are cached per (storage, length, :attr:`~tdreplay.core.Storage.revision`) and
    dropped by :meth:`invalidate`.
    """

    def __init__(self) -> None:
        self.invalidate()

    def invalidate(self) -> None:
        self._cache_key: Any = None
        self._td: Any = None
        self._flat: dict[Any, torch.Tensor | None] = {}

    def _view(self, storage: Any) -> Any:
        key = (id(storage), len(storage), storage.revision)
        if key != self._cache_key:
            self._flat = {}
            self._td = None
            if not isinstance(storage, ListStorage) and len(storage):
                data = storage[:]
                self._td = data if is_tensor_collection(data) else None
            self._cache_key = key
        return self._td

    def _example(self, storage: Any) -> Any:
        """What tells the storage's keys: its view, or the first item of a list storage."""
        td = self._view(storage)
        if td is None and isinstance(storage, ListStorage) and len(storage):
            td = storage.get(0)
        return td

    def describe(self, storage: Any) -> str:
        """Which keys the storage holds, for error messages."""
        td = self._example(storage)
        if td is None or not is_tensor_collection(td):
            return f"the storage holds {type(td).__name__ if td is not None else 'no'} data, " \
                   "not TensorDicts"
        keys = sorted(map(str, td.keys(include_nested=True, leaves_only=True)))
        return f"the stored TensorDicts have the keys {keys}"

    def has(self, storage: Any, key: Any) -> bool:
        td = self._example(storage)
        if td is None or not is_tensor_collection(td):
            return False
        return unravel_key(key) in td.keys(include_nested=True, leaves_only=True)

    def flat(self, storage: Any, key: Any) -> torch.Tensor | None:
        """``[len(storage), *feature]`` view of entry ``key`` (tensor storages only)."""
        td = self._view(storage)
        if td is None:
            return None
        if key not in self._flat:
            leaf = td.get(key, None)
            if isinstance(leaf, torch.Tensor) and td.batch_dims > 1:
                leaf = leaf.flatten(0, td.batch_dims - 1)
            self._flat[key] = leaf if isinstance(leaf, torch.Tensor) else None
        return self._flat[key]

    def gather(self, storage: Any, key: Any, slots: torch.Tensor) -> torch.Tensor | None:
        """Entry ``key`` at flat ``slots`` (``None`` when the storage does not hold it)."""
        flat = self.flat(storage, key)
        if flat is not None:
            return flat[slots.to(flat.device)]
        if isinstance(storage, ListStorage) and self.has(storage, key):
            items = storage.get(slots.reshape(-1))
            if isinstance(items, LazyStackedTensorDict):  # a LazyStackStorage's read
                items = items.tensordicts
            elif is_tensor_collection(items):
                items = items.unbind(0)
            return torch.stack([torch.as_tensor(item.get(unravel_key(key))) for item in items])
        return None

    def block(self, storage: Any, key: Any, start: int, stop: int) -> torch.Tensor | None:
        """Entry ``key`` of slots ``[start, stop)``."""
        flat = self.flat(storage, key)
        if flat is not None:
            return flat[start:stop]
        return self.gather(storage, key, torch.arange(start, stop))


class SignalShapeError(ValueError, RuntimeError):
    """A trajectory signal holding more than one value per step: a ``ValueError`` and, as
    TorchRL's error for it, a ``RuntimeError``."""


def _per_step(values: torch.Tensor, what: str, name: str, storage_ndim: int) -> torch.Tensor:
    """``values`` of flat slots as ``[k, 1]``, refusing several values per step."""
    k = values.shape[0] if values.ndim else 1
    flat = values.reshape(k, -1)
    if flat.shape[1] != 1:
        raise SignalShapeError(
            f"Expected the end-of-trajectory signal to be {storage_ndim}-dimensional (the "
            f"storage's dims): the {what} {name} holds {flat.shape[1]} values per step (per-step "
            f"shape {tuple(values.shape[1:])}); store one {what.split()[0]} value per step.")
    return flat


_INT64_BOUND = 2.0 ** 63  # floats at or beyond it do not fit in an int64


def whole_ids(values: torch.Tensor, what: str) -> torch.Tensor:
    """Trajectory ids ``values`` as int64: integer (or bool) ids as they are, floating ids
    (TorchRL's examples write ``"episode": torch.zeros(n)``) cast exactly when every value is
    a whole number within the int64 range. ``what`` names the ids in errors: a
    ``ValueError`` for ids that are not whole numbers or not finite, a ``TypeError`` for
    complex ones.

    Examples
    --------
    >>> whole_ids(torch.tensor([0.0, 0.0, 3.0]), "the trajectory key 'episode'").tolist()
    [0, 0, 3]
    >>> whole_ids(torch.tensor([0.0, 0.5]), "the trajectory key 'episode'")
    Traceback (most recent call last):
    ...
    ValueError: the trajectory key 'episode' must hold whole-number trajectory ids: found 0.5.
    """
    check_whole_numbers(values, what, "trajectory ids")
    if not values.is_floating_point():
        return values.to(torch.int64)
    wide = values.detach().to(torch.float64)
    big = wide.abs() >= _INT64_BOUND
    if bool(big.any()):
        raise ValueError(f"{what} must hold whole-number trajectory ids: found "
                         f"{wide[big].reshape(-1)[0].item()!r}, beyond the int64 range.")
    return wide.to(torch.int64)


def ids_array(values: torch.Tensor, name: str, storage_ndim: int = 1) -> np.ndarray:
    """Per-step trajectory ids as a contiguous int64 numpy array (floating ids that are
    whole numbers are cast exactly, see :func:`whole_ids`)."""
    flat = _per_step(values, "trajectory key", name, storage_ndim)
    ids = whole_ids(flat[:, 0], f"the trajectory key {name}")
    return np.ascontiguousarray(ids.cpu().numpy())


def ends_array(values: torch.Tensor, name: str, storage_ndim: int = 1) -> np.ndarray:
    """Per-step end flags as a contiguous bool numpy array; one flag per step, as TorchRL
    (a ``[..., 1]`` trailing dim is fine)."""
    flat = _per_step(values, "end key", name, storage_ndim)
    if flat.dtype is not torch.bool:
        flat = flat != 0
    return np.ascontiguousarray(flat[:, 0].cpu().numpy())


def touches(edited: list[Any] | None, keys: list[Any]) -> bool:
    """Whether editing the entries ``edited`` (``None``: any entry) may change one of ``keys``
    (an edited entry is one of them or holds one of them).

    Examples
    --------
    >>> touches(["next"], [("next", "done")]), touches(["obs"], [("next", "done")])
    (True, False)
    """
    if edited is None:
        return True
    for key in edited:
        path = unravel_key(key)
        path = path if isinstance(path, tuple) else (path,)
        for signal in keys:
            signal_path = signal if isinstance(signal, tuple) else (signal,)
            if signal_path[: len(path)] == path:
                return True
    return False
