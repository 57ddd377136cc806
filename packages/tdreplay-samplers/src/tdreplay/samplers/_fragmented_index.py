"""Trajectories whose steps are scattered over the storage (``SliceSampler(fragmented=True)``).

Several collectors writing into one buffer interleave their steps: step ``t + 1`` of a
trajectory need not sit in the slot after step ``t``. :class:`FragmentedIndex` orders the
stored steps by ``(trajectory id, step number)`` instead of by slot and cuts them into *runs*:
steps of one trajectory whose step numbers follow each other. A step number that is missing
(overwritten, or never written) ends a run; the next step present starts another one.

The runs are a pure function of the stored ids and step numbers (not of the write order), so
a sampler restored from a checkpoint, or unpickled in another process, finds the same runs.
They are recomputed from the storage (one ``O(n log n)`` sort) when the storage's
:attr:`~tdreplay.core.Storage.revision` changes, and reused while it does not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch

from ._slicing import ragged_arange
from ._storage_entries import MissingKeyError, SignalShapeError, StorageEntries, key_name

__all__ = ["DuplicateStepError", "FragmentedIndex", "MissingEntryError", "Runs",
           "check_step_values", "draw_run_slices", "find_runs"]


class DuplicateStepError(RuntimeError):
    """The storage holds the same ``(trajectory, step)`` pair twice (TorchRL raises a
    ``RuntimeError`` too)."""


class MissingEntryError(MissingKeyError, TypeError):
    """An entry the fragmented index reads is not stored: a ``KeyError`` and, as TorchRL's
    error for it, a ``TypeError``."""


class Runs(NamedTuple):
    """Runs of consecutive steps, laid end to end in ``(trajectory, step)`` order."""

    #: every stored slot, in ``(trajectory id, step number)`` order (int64)
    slots: np.ndarray
    #: place in :attr:`slots` of the first step of each run (int64)
    starts: np.ndarray
    #: steps of each run (int64)
    lengths: np.ndarray


def check_step_values(values: Any, key: Any, argument: str) -> None:
    """Refuse ids or step numbers that are not integers (``TypeError``) and negative step
    numbers (``ValueError``), naming the entry and the argument that names it.

    Examples
    --------
    >>> check_step_values(torch.tensor([0, 1]), "step_count", "step_key")
    >>> check_step_values(torch.tensor([0.0, 1.0]), "episode", "traj_key")
    Traceback (most recent call last):
    ...
    TypeError: traj_key='episode' must hold integers (fragmented=True), got torch.float32.
    """
    if not isinstance(values, torch.Tensor):
        raise TypeError(f"{argument}={key_name(key)} must hold a tensor (fragmented=True), got "
                        f"{type(values).__name__}.")
    if values.dtype is torch.bool or values.is_floating_point() or values.is_complex():
        raise TypeError(f"{argument}={key_name(key)} must hold integers (fragmented=True), got "
                        f"{values.dtype}.")
    if argument == "step_key" and values.numel() and bool((values < 0).any()):
        found = int(values[values < 0].reshape(-1)[0])
        raise ValueError(f"step numbers must be non-negative: step_key={key_name(key)} holds "
                         f"{found}.")


def _column(entries: StorageEntries, storage: Any, key: Any, argument: str) -> np.ndarray:
    """Entry ``key`` of every stored step as int64, one value per step."""
    n = len(storage)
    if not entries.has(storage, key):
        raise MissingEntryError(
            f"fragmented=True reads {argument}={key_name(key)} from every stored step, but the "
            f"storage has no such entry ({entries.describe(storage)}).")
    values = entries.block(storage, key, 0, n)
    check_step_values(values, key, argument)
    assert isinstance(values, torch.Tensor)
    flat = values.reshape(n, -1)
    if flat.shape[1] != 1:
        raise SignalShapeError(
            f"{argument}={key_name(key)} must hold one value per step (fragmented=True), got "
            f"{flat.shape[1]} (per-step shape {tuple(values.shape[1:])}).")
    return np.ascontiguousarray(flat[:, 0].to(torch.int64).cpu().numpy())


def find_runs(traj: np.ndarray, step: np.ndarray, keys: tuple[Any, Any] = ("traj", "step")
              ) -> Runs:
    """The runs of steps ``step`` of trajectories ``traj`` (both int64, one per slot).

    Raises :class:`DuplicateStepError` when a ``(trajectory, step)`` pair is stored twice and
    a ``ValueError`` for a negative step; ``keys`` (trajectory key, step key) name the entries
    in those errors.

    Examples
    --------
    Two collectors interleaved: slots 0, 2, 3 hold steps 0-2 of trajectory 7, slots 1 and 4
    steps 5 and 7 of trajectory 3 (step 6 is missing).

    >>> runs = find_runs(np.array([7, 3, 7, 7, 3]), np.array([0, 5, 1, 2, 7]))
    >>> runs.slots.tolist(), runs.starts.tolist(), runs.lengths.tolist()
    ([1, 4, 0, 2, 3], [0, 1, 2], [1, 1, 3])
    """
    n = traj.size
    if n and int(step.min()) < 0:
        slot = int(np.flatnonzero(step < 0)[0])
        raise ValueError(f"step numbers must be non-negative: step_key={key_name(keys[1])} "
                         f"holds {int(step[slot])} at slot {slot}.")
    order = np.lexsort((step, traj))  # by trajectory, then step (stable)
    t, s = traj[order], step[order]
    same_traj = t[1:] == t[:-1]
    twice = np.flatnonzero(same_traj & (s[1:] == s[:-1]))
    if twice.size:
        i = int(twice[0])
        raise DuplicateStepError(
            f"the storage holds trajectory {int(t[i])} step {int(s[i])} twice (slots "
            f"{int(order[i])} and {int(order[i + 1])}; traj_key={key_name(keys[0])}, "
            f"step_key={key_name(keys[1])}): (trajectory, step) pairs must be unique among the "
            "stored steps. This happens when trajectory ids are reused, e.g. a recreated "
            "collector restarting its traj_ids at 0 while episodes of the previous one are "
            "still stored: use ids that stay unique over the buffer's life, or empty it first.")
    new_run = np.ones(n, dtype=np.bool_)
    new_run[1:] = ~(same_traj & (s[1:] == s[:-1] + 1))
    starts = np.flatnonzero(new_run).astype(np.int64)
    lengths = np.diff(np.append(starts, n)).astype(np.int64)
    return Runs(order.astype(np.int64), starts, lengths)


def no_run_error(lengths: np.ndarray, seq_len: int) -> RuntimeError:
    """The error of a batch for which no run is long enough (``strict_length=True``)."""
    return RuntimeError(
        f"Did not find a single fragmented trajectory run with sufficient length (length "
        f"range: {int(lengths.min())} - {int(lengths.max())} / required={seq_len}): use "
        "shorter slices or strict_length=False.")


def draw_run_slices(runs: Runs, k: int, seq_len: int, strict_length: bool,
                    randint: Callable[[int, int], np.ndarray],
                    rand: Callable[[int], torch.Tensor]) -> tuple[torch.Tensor, np.ndarray]:
    """``k`` slices of ``seq_len`` steps: runs drawn uniformly (among those of at least
    ``seq_len`` steps with ``strict_length``; a shorter run gives a shorter slice otherwise),
    each cut at a start drawn uniformly. ``randint(high, n)`` draws ``n`` ints in ``[0,
    high)``, then ``rand(n)`` ``n`` floats in ``[0, 1)``: TorchRL's draws, in its order and
    precision, so a generator in the same state gives TorchRL's slices.

    Returns the slots of the slices laid end to end, each in step order, and the place of
    each slice's last step in them.

    Examples
    --------
    >>> runs = find_runs(np.array([7, 3, 7, 7, 3]), np.array([0, 5, 1, 2, 7]))
    >>> first = lambda high, n: np.zeros(n, dtype=np.int64)  # the first run long enough
    >>> ends_first = lambda n: torch.tensor([0.0, 0.99])     # its first and last starts
    >>> slots, ends = draw_run_slices(runs, 2, 2, True, first, ends_first)
    >>> slots.tolist(), ends.tolist()
    ([0, 2, 2, 3], [1, 3])
    """
    lengths = runs.lengths
    if lengths.size == 0:
        raise RuntimeError("No logical trajectory runs are available for sampling.")
    candidates = np.flatnonzero(lengths >= seq_len) if strict_length \
        else np.arange(lengths.size)
    if candidates.size == 0:
        raise no_run_error(lengths, seq_len)
    chosen = candidates[randint(candidates.size, k)]
    run_len = lengths[chosen]
    seq = np.minimum(run_len, seq_len)
    rel = (rand(k) * torch.from_numpy(run_len - seq + 1)).floor().to(torch.int64).numpy()
    owner, offset = ragged_arange(seq)
    slots = runs.slots[runs.starts[chosen][owner] + rel[owner] + offset]
    return torch.from_numpy(np.ascontiguousarray(slots)), np.cumsum(seq) - 1


class FragmentedIndex:
    """The runs of a storage's steps (see the module docstring), recomputed when the storage,
    its revision, its length or the keys read change.

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> from tdreplay.storages import LazyTensorStorage
    >>> storage = LazyTensorStorage(8)
    >>> storage.set(torch.arange(5), TensorDict({"episode": torch.tensor([7, 3, 7, 7, 3]),
    ...                                          "step": torch.tensor([0, 5, 1, 2, 6])}, [5]))
    >>> index = FragmentedIndex()
    >>> runs = index.runs(storage, StorageEntries(), "episode", "step")
    >>> runs.slots.tolist(), runs.lengths.tolist()
    ([1, 4, 0, 2, 3], [2, 3])
    >>> index.runs(storage, StorageEntries(), "episode", "step") is runs  # nothing written
    True
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget the runs: the next :meth:`runs` reads the storage."""
        self._runs: Runs | None = None
        self._source: tuple[Any, ...] | None = None  # (storage, revision, length, keys)

    def __getstate__(self) -> dict[str, Any]:
        return {"_runs": None, "_source": None}  # recomputed from the storage it next sees

    def runs(self, storage: Any, entries: StorageEntries, traj_key: Any, step_key: Any) -> Runs:
        """The runs of ``storage``'s steps, read under ``traj_key`` and ``step_key``.

        All or nothing: when the stored values are refused (missing entry, not integers,
        negative steps, duplicate pairs: see :func:`find_runs`), the index is left as it was
        and the next call reads the storage again.
        """
        ndim = storage.ndim
        if ndim != 1:
            raise NotImplementedError(
                f"fragmented=True supports one-dimensional storages only, got ndim={ndim}: "
                "write the steps of every environment one after the other (ndim=1).")
        source = (storage, storage.revision, len(storage), (traj_key, step_key))
        if self._runs is not None and self._source is not None \
                and self._source[0] is storage and self._source[1:] == source[1:]:
            return self._runs
        traj = _column(entries, storage, traj_key, "traj_key")
        step = _column(entries, storage, step_key, "step_key")
        runs = find_runs(traj, step, (traj_key, step_key))
        self._runs, self._source = runs, source
        return runs
