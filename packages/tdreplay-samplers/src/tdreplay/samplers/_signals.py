"""Which stored entries delimit the trajectories of a slice sampler, and reading them.

TorchRL's rules: an explicit trajectory key that the data lacks falls back to the end key;
explicit ``end_keys`` that the data lacks fall back to the trajectory ids (one ``end_key``
given alone that the data lacks is refused, :func:`missing_end_key`, as TorchRL raises); with
neither given, ``("collector", "traj_ids")`` (written by collectors), then ``"episode"``, then
the end key.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._storage_entries import MissingKeyError, StorageEntries, ends_array, ids_array, key_name

__all__ = ["AUTO_TRAJ_KEYS", "MissingEndKeyError", "Signals", "missing_end_key", "read_signals",
           "resolve_signals"]

#: Trajectory-id entries looked for, in order, when no key is given.
AUTO_TRAJ_KEYS: tuple[Any, ...] = (("collector", "traj_ids"), "episode")

#: ``(trajectory key or None, end keys or None)``.
Signals = tuple[Any, "tuple[Any, ...] | None"]


class MissingEndKeyError(MissingKeyError, RuntimeError):
    """The ``end_key`` a slice sampler was given is not stored: a ``KeyError``, and a
    ``RuntimeError`` as TorchRL raises."""


class MissingSignalsError(MissingKeyError, RuntimeError):
    """A slice sampler found neither a trajectory key nor an end key in the storage: a
    ``KeyError``, and a ``RuntimeError`` as TorchRL raises (``except RuntimeError`` written for
    TorchRL keeps working)."""


def missing_end_key(entries: StorageEntries, storage: Any, owner: str,
                    end_key: Any) -> MissingEndKeyError:
    """The error of a slice sampler given ``end_key`` alone when ``storage`` lacks it."""
    return MissingEndKeyError(
        f"{owner}(end_key={end_key!r}): the storage has no entry {key_name(end_key)} "
        f"({entries.describe(storage)}). Name the entry that holds the end-of-trajectory "
        "flags, or give traj_key=... (trajectory ids) instead; end_keys=[...] lists several "
        "flags of which the missing ones are skipped.")


def traj_key_candidates(traj_key: Any | None) -> tuple[Any, ...]:
    """The keys a slice sampler reads trajectory ids from, in order of preference: the
    ``traj_key`` given, else (``None``) the keys it detects (``AUTO_TRAJ_KEYS``).

    Examples
    --------
    >>> traj_key_candidates("episode"), traj_key_candidates(None) == AUTO_TRAJ_KEYS
    (('episode',), True)
    """
    return (traj_key,) if traj_key is not None else AUTO_TRAJ_KEYS


def resolve_signals(entries: StorageEntries, storage: Any, owner: str, *,
                    traj_key: Any | None, end_keys: tuple[Any, ...]) -> Signals:
    """The entries of ``storage`` that delimit trajectories.

    ``traj_key``: the trajectory key given (``None``: not given); ``end_keys``: the end keys
    given, or the default end key. Raises :class:`MissingSignalsError` when none is stored.
    """
    def present(keys: tuple[Any, ...]) -> tuple[Any, ...] | None:
        found = tuple(k for k in keys if entries.has(storage, k))
        return found or None

    traj = next((k for k in traj_key_candidates(traj_key) if entries.has(storage, k)), None)
    ends = present(end_keys)
    if traj is not None or ends is not None:
        return traj, ends
    wanted = [key_name(traj_key)] if traj_key is not None \
        else [key_name(k) for k in AUTO_TRAJ_KEYS]
    raise MissingSignalsError(
        f"{owner} found neither a trajectory key ({' or '.join(wanted)}) nor an end key "
        f"({' or '.join(key_name(k) for k in end_keys)}) in the storage "
        f"({entries.describe(storage)}): pass traj_key=..., end_key=... or end_keys=... "
        "naming the entries that delimit trajectories.")


def read_signals(entries: StorageEntries, storage: Any, signals: Signals, start: int,
                 stop: int) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Trajectory ids and end flags (any end key set) of flat slots ``[start, stop)``."""
    traj, ends = signals
    ids = done = None
    shape = storage.shape
    ndim = len(shape) if shape is not None else 1
    if traj is not None:
        ids = ids_array(_block(entries, storage, traj, start, stop), key_name(traj), ndim)
    if ends is not None:
        for key in ends:
            flags = ends_array(_block(entries, storage, key, start, stop), key_name(key), ndim)
            done = flags if done is None else done | flags
    return ids, done


def _block(entries: StorageEntries, storage: Any, key: Any, start: int, stop: int) -> Any:
    values = entries.block(storage, key, start, stop)
    assert values is not None  # resolve_signals found the key in the storage
    return values
