"""The trajectories a slice sampler draws from: which entries define them (the trajectory
ids or the end flags, given or detected), and its
:class:`~tdreplay.samplers._trajectory_index.TrajectoryIndex` kept up to date with the storage,
all or nothing (:class:`TrajectorySyncMixin`, mixed into
:class:`~tdreplay.samplers.SliceSampler`).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch

from tdreplay.core import Storage
from tdreplay.core.utils import NestedKey

from ._signals import Signals, missing_end_key, read_signals, resolve_signals
from ._slicing import static_cut
from ._storage_entries import StorageEntries
from ._trajectory_index import TrajectoryIndex

__all__ = ["TrajectorySyncMixin"]


class TrajectorySyncMixin:
    """Resolving a slice sampler's trajectory signals and syncing its trajectory index."""

    traj_key: NestedKey
    _explicit_traj: bool
    _explicit_end: bool
    end_key: NestedKey
    end_keys: tuple[NestedKey, ...] | None
    _end_keys: tuple[NestedKey, ...]
    _entries: StorageEntries
    _signals: Signals | None
    _static_traj: torch.Tensor | None
    _static_ends: torch.Tensor | None
    _index: TrajectoryIndex
    #: The signals the index of a restored state was built from (``None``: not known, or
    #: checked already): the first sync after the restore compares them with this sampler's.
    _restored_signals: Signals | None = None

    def _index_state(self) -> dict[str, Any]:
        """The index's state, with the signals its trajectories were cut by (``"signals"``:
        ``[traj key or None, [end keys] or None]``, ``None`` before they were resolved)."""
        state = self._index.state_dict()
        # (restored and not synced since: the signals of the restored index)
        signals = self._signals if self._signals is not None else self._restored_signals
        state["signals"] = None if signals is None else [
            signals[0], None if signals[1] is None else list(signals[1])]
        return state

    def _note_restored_signals(self, state: dict[str, Any]) -> None:
        """Remember the signals of a restored index state (checked by
        :func:`~._index_state.check_index_state`)."""
        saved = state.get("signals")
        self._restored_signals = None if saved is None else (
            saved[0], None if saved[1] is None else tuple(saved[1]))

    def _resolve_signals(self, storage: Storage) -> Signals:
        """Which entries define the trajectories: ``(traj key or None, end keys or None)``."""
        traj_key = self.traj_key if self._explicit_traj else None
        # explicit end keys are looked at first only when no trajectory key is given: the
        # trajectory ids come first otherwise (TorchRL's order), the end keys are the fallback
        signals = resolve_signals(self._entries, storage, type(self).__name__,
                                  traj_key=traj_key, end_keys=self._end_keys)
        traj, ends = signals
        if ends is None and self.end_keys is None and self._explicit_end \
                and not self._explicit_traj:
            # one end key given, alone, and not stored: a misspelt key would otherwise cut the
            # trajectories along ids it never named (TorchRL raises too; several end_keys of
            # which none is stored fall back to the trajectory ids, as TorchRL's)
            raise missing_end_key(self._entries, storage, type(self).__name__, self.end_key)
        if self._explicit_traj and traj is None:  # (TorchRL logs it; a typo shows here)
            warnings.warn(f"{type(self).__name__}(traj_key={self.traj_key!r}): the storage has no "
                          f"such entry ({self._entries.describe(storage)}); the trajectories "
                          f"are cut at the end flags {list(ends or ())} instead, as TorchRL "
                          "does.", UserWarning, stacklevel=2)
        if self._explicit_end and not self._explicit_traj and ends is not None:
            traj = None  # end keys given and stored: trajectories by end flags only
        elif self._explicit_traj and traj is not None and not self._explicit_end:
            ends = None  # trajectory key given and stored
        elif not self._explicit_traj and not self._explicit_end and traj is not None:
            ends = None  # detected trajectory ids
        if traj is not None and not self._explicit_traj:
            self.traj_key = traj  # the key detected, as TorchRL reports it
        return traj, ends

    def _read_block(self, storage: Storage, start: int, stop: int
                    ) -> tuple[np.ndarray | None, np.ndarray | None]:
        if self._static_traj is not None:
            return np.ascontiguousarray(self._static_traj[start:stop].numpy()), None
        if self._static_ends is not None:
            return None, np.ascontiguousarray(self._static_ends[start:stop].numpy())
        assert self._signals is not None  # resolved by _sync before the index reads blocks
        return read_signals(self._entries, storage, self._signals, start, stop)

    def _sync(self, storage: Storage, index: TrajectoryIndex | None = None
              ) -> TrajectoryIndex:
        """The trajectory index (``index``, the sampler's by default) brought up to date with
        ``storage``. All or nothing: when it raises (e.g. trajectory ids that are not whole
        numbers), the signals resolved and the index are left as they were (see
        :meth:`TrajectoryIndex.sync`), so a failed sample changes nothing and the next one
        retries."""
        index = self._index if index is None else index
        signals, traj_key = self._signals, self.traj_key
        try:
            return self._sync_index(storage, index)
        except BaseException:
            self._signals, self.traj_key = signals, traj_key
            raise

    def _sync_index(self, storage: Storage, index: TrajectoryIndex) -> TrajectoryIndex:
        n = len(storage)
        static = self._static_traj if self._static_traj is not None else self._static_ends
        if static is not None:
            if static.numel() != n:
                raise ValueError(f"{'trajectories' if self._static_traj is not None else 'ends'}"
                                 f" describes {static.numel()} steps but the storage holds {n}.")
            if index.cut_after is None:  # O(steps): once, the flags never change
                index.cut_after = static_cut(static, ends=self._static_ends is not None)
            if index.pending:  # the flags alone cut the ring, never the newest write
                index.forget_write_order()
        elif self._signals is None or index.pending or index.needs_rebuild:
            self._signals = self._resolve_signals(storage)
            restored = self._restored_signals
            if restored is not None and index is self._index:
                self._restored_signals = None
                if restored != self._signals:
                    # a checkpoint of a sampler that cut the trajectories by other entries
                    # (another traj_key / end_key): cut them again as this one does
                    index.note_update()
        index.sync(storage, self._read_block)
        return index

    def _peek(self, storage: Storage) -> TrajectoryIndex | None:
        """The trajectories of ``storage`` as the next batch will find them, leaving the
        sampler as it was: its index is synced only when that changes nothing
        (:meth:`TrajectoryIndex.scratch`; else a copy is), and the signals resolved are put
        back. ``None`` when they cannot be read (no trajectory key nor end key stored yet,
        ids that are not whole numbers...): the rollback of :meth:`_sync` has run."""
        signals, traj_key = self._signals, self.traj_key
        try:
            return self._sync(storage, self._index.scratch(storage))
        except Exception:
            return None
        finally:
            self._signals, self.traj_key = signals, traj_key
