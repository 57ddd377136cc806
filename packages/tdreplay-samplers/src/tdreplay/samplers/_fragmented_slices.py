"""``SliceSampler(fragmented=True)``: slices cut along ``(trajectory id, step number)`` rather
than along storage slots (:class:`FragmentedSlicesMixin`, mixed into
:class:`~tdreplay.samplers.SliceSampler`; the runs come from
:class:`~tdreplay.samplers._fragmented_index.FragmentedIndex`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from tensordict import is_tensor_collection, unravel_key

from tdreplay.core import Storage
from tdreplay.core.utils import NestedKey, check_flag, check_not_empty

from ._fragmented_index import FragmentedIndex, Runs, check_step_values, draw_run_slices
from ._signals import AUTO_TRAJ_KEYS
from ._slicing import ArgumentConflictError, slice_shape
from ._storage_entries import StorageEntries, key_name, touches

__all__ = ["FragmentedSlicesMixin", "check_fragmented_arguments"]


def check_fragmented_arguments(fragmented: Any, step_key: Any, *, traj_key: Any, end_key: Any,
                               end_keys: Any, ends: Any, trajectories: Any,
                               span: tuple[bool | int, bool | int], compile: Any
                               ) -> tuple[bool, NestedKey | None]:
    """``(fragmented, step_key)`` checked against the other arguments of a
    :class:`~tdreplay.samplers.SliceSampler`, with TorchRL's errors (``step_key=None``, ``ends``
    and ``trajectories``: ``ValueError``; ``span`` and ``compile``: ``NotImplementedError``).
    End keys without a trajectory key cannot tell interleaved trajectories apart: refused
    here (a ``ValueError`` and, as TorchRL's error at sampling time, a ``RuntimeError``)."""
    fragmented = check_flag(fragmented, "fragmented")
    if step_key is not None:
        try:
            step_key = unravel_key(step_key)
        except Exception as err:
            raise TypeError(f"step_key must be a key (a str or a tuple of str) or None, got "
                            f"{step_key!r}.") from err
    if not fragmented:
        return False, step_key
    if step_key is None:
        raise ValueError("step_key must be provided when fragmented=True.")
    if ends is not None:
        raise ValueError("fragmented=True requires trajectory and step identifiers; the static "
                         "ends argument cannot reconstruct interleaved trajectories.")
    if trajectories is not None:
        raise ValueError("The static trajectories argument is not supported with "
                         "fragmented=True; provide traj_key and step_key.")
    if traj_key is None and (end_key is not None or end_keys is not None):
        raise ArgumentConflictError(
            "fragmented=True requires a trajectory identifier: end_key/end_keys alone cannot "
            "reconstruct interleaved trajectories; pass traj_key (and step_key).")
    if span[0] or span[1]:
        raise NotImplementedError("span is not supported with fragmented=True.")
    if compile:
        raise NotImplementedError("compile is not supported with fragmented=True.")
    return True, step_key


class FragmentedSlicesMixin:
    """Sampling slices of interleaved trajectories (``fragmented=True``)."""

    traj_key: NestedKey
    _explicit_traj: bool
    _entries: StorageEntries
    _fragmented: bool
    _step_key: NestedKey | None
    _fragments: FragmentedIndex
    _rng: torch.Generator | None
    num_slices: int | None
    slice_len: int | None
    strict_length: bool
    pad_output: bool
    # SliceSampler's: uniform ints in [0, high), and a batch's slots and info
    _randint: Callable[[int, int], np.ndarray]
    _output: Callable[..., tuple[torch.Tensor, dict[str, Any]]]

    @property
    def fragmented(self) -> bool:
        """Whether slices follow ``(traj_key, step_key)`` rather than storage slots.

        Examples
        --------
        Two collectors write their steps interleaved into one buffer; every slice holds
        consecutive steps of one trajectory, in step order.

        >>> from tensordict import TensorDict
        >>> from tdreplay.core import TensorDictReplayBuffer
        >>> from tdreplay.samplers import SliceSampler
        >>> from tdreplay.storages import LazyTensorStorage
        >>> sampler = SliceSampler(slice_len=3, traj_key="episode", fragmented=True)
        >>> rb = TensorDictReplayBuffer(storage=LazyTensorStorage(20), sampler=sampler,
        ...                             batch_size=6)
        >>> for t in range(4):  # collector A runs episode 0, collector B episode 1
        ...     _ = rb.extend(TensorDict({"episode": torch.tensor([0, 1]),
        ...                               "step_count": torch.tensor([t, t])}, [2]))
        >>> sampler.fragmented
        True
        >>> s = rb.sample().reshape(2, 3)
        >>> s["step_count"].diff().eq(1).all().item()  # consecutive steps of one episode
        True
        >>> bool((s["episode"] == s["episode"][:, :1]).all())
        True
        """
        return self._fragmented

    @property
    def step_key(self) -> NestedKey | None:
        """The entry holding each step's number within its trajectory (``fragmented=True``)."""
        return self._step_key

    def _fragment_traj_key(self, storage: Storage) -> NestedKey:
        """The trajectory key read: ``traj_key`` when given, else the first of
        ``("collector", "traj_ids")`` and ``"episode"`` that the storage holds (TorchRL's
        detection; there is no fallback on end flags, which cannot tell interleaved
        trajectories apart)."""
        if self._explicit_traj:
            return self.traj_key
        for key in AUTO_TRAJ_KEYS:
            if self._entries.has(storage, key):
                return key
        raise RuntimeError(
            "fragmented=True requires a trajectory identifier: found neither "
            f"{' nor '.join(key_name(k) for k in AUTO_TRAJ_KEYS)} in the storage "
            f"({self._entries.describe(storage)}); end-of-trajectory flags alone cannot "
            "reconstruct interleaved data: pass traj_key=...")

    def _fragment_runs(self, storage: Storage) -> tuple[Runs, NestedKey]:
        """The runs of ``storage`` and the trajectory key they were read under."""
        check_not_empty(storage)
        traj_key = self._fragment_traj_key(storage)
        return self._fragments.runs(storage, self._entries, traj_key, self._step_key), traj_key

    def _sample_fragmented(self, storage: Storage, batch_size: int
                           ) -> tuple[torch.Tensor, dict[str, Any]]:
        num_slices, seq_len = slice_shape(batch_size, self.num_slices, self.slice_len)
        runs, traj_key = self._fragment_runs(storage)
        slots, ends = draw_run_slices(runs, num_slices, seq_len, self.strict_length,
                                      self._randint, self._rand)
        self.traj_key = traj_key  # the key detected, as TorchRL reports it
        # as TorchRL's fragmented mode: pad_output pads every batch (the mask may be all True)
        return self._output(storage, slots, ends, seq_len if self.pad_output else None)

    def _can_sample_fragmented(self, storage: Storage, batch_size: int) -> bool:
        """Whether a run can hold a slice (any run unless ``strict_length``); ``False`` when the
        runs cannot be read (see :meth:`~tdreplay.samplers.SliceSampler.can_sample`)."""
        _, seq_len = slice_shape(batch_size, self.num_slices, self.slice_len)
        try:
            runs, _ = self._fragment_runs(storage)
        except Exception:
            return False
        return bool((runs.lengths >= (seq_len if self.strict_length else 1)).any())

    def _check_fragmented_write(self, data: Any) -> None:
        """Refuse ids or step numbers that are not integers, and negative step numbers, before
        they are written (see :func:`~._fragmented_index.check_step_values`)."""
        if not is_tensor_collection(data):
            return
        traj_keys = (self.traj_key,) if self._explicit_traj else AUTO_TRAJ_KEYS
        traj_key = next((k for k in traj_keys if data.get(k, None) is not None), None)
        for key, argument in ((traj_key, "traj_key"), (self._step_key, "step_key")):
            values = data.get(key, None) if key is not None else None
            if values is not None:
                check_step_values(values, key, argument)

    def _rand(self, n: int) -> torch.Tensor:
        return torch.rand(n, generator=self._rng)

    def _fragment_keys_edited(self, keys: list[NestedKey] | None) -> bool:
        """Whether editing the entries ``keys`` in place may change the runs."""
        return touches(keys, [self.traj_key, *AUTO_TRAJ_KEYS, self._step_key])

