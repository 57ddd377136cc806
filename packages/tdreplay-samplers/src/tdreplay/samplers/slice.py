"""Slice samplers: batches made of contiguous pieces of trajectories.

:class:`SliceSampler` (with replacement) and :class:`SliceSamplerWithoutReplacement` (each
trajectory once per epoch). Trajectory boundaries are kept up to date incrementally by a
:class:`~tdreplay.samplers._trajectory_index.TrajectoryIndex` (see that module for the design),
so sampling costs ``O(batch)`` whatever the size of the buffer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from tensordict import is_tensor_collection, unravel_key

from tdreplay.core import BatchLargerThanBufferError, ListStorage, Sampler, Storage
from tdreplay.core.utils import NestedKey, check_count, check_flag, check_key, check_not_empty

from ._fragmented_index import FragmentedIndex
from ._fragmented_slices import FragmentedSlicesMixin, check_fragmented_arguments
from ._list_items import first_unreadable_item
from ._signals import AUTO_TRAJ_KEYS, Signals, traj_key_candidates
from ._slice_output import INIT_KEY, check_init_key, slice_info
from ._slice_trajectories import TrajectorySyncMixin
from ._slicing import (
    ArgumentConflictError,
    SliceBatchError,
    SliceSizeError,
    check_static,
    draw_trajectories,
    no_trajectory_error,
    slice_shape,
    slice_slots,
    span_starts,
)
from ._storage_entries import StorageEntries, key_name, touches, whole_ids
from ._trajectory_index import LANE, LEN, START, TrajectoryIndex
from .without_replacement import SamplerWithoutReplacement, check_replacement

_DEFAULT_END_KEY = ("next", "done")
_DEFAULT_TRAJ_KEY = "episode"  # what traj_key reports until a key is detected


def _normalize_span(span: Any) -> tuple[bool | int, bool | int]:
    def one(x: Any) -> bool | int:
        if isinstance(x, (bool, np.bool_)):
            return bool(x)
        if isinstance(x, (int, np.integer)) and x >= 0:
            return int(x)
        raise ValueError(f"span must be a bool, a non-negative int or a pair of them, "
                         f"got {span!r}.")

    if isinstance(span, (tuple, list)):
        if len(span) != 2:
            raise ValueError(f"span must be a bool, an int or a pair, got {span!r}.")
        return one(span[0]), one(span[1])
    value = one(span)
    return value, value


def _replace_last(key: Any, name: str) -> Any:
    key = unravel_key(key)
    return (*key[:-1], name) if isinstance(key, tuple) else name


class StorageItemsError(TypeError, RuntimeError):
    """An item of a list storage a slice sampler cannot read (no TensorDict, or lacking an
    entry the first item holds): a ``TypeError`` and, as TorchRL's error for list storages
    ("Could not get a tensordict out of the storage"), a ``RuntimeError``."""


def check_list_items(storage: Storage, keys: Sequence[tuple[NestedKey | None, str]],
                     owner: str) -> None:
    """Raise :class:`StorageItemsError` naming the first item of a ``ListStorage`` that is no
    TensorDict or lacks one of ``keys`` (``(key, argument)`` pairs; ``None`` keys and keys
    the first item lacks are not read, so not checked). Called when reading the items failed,
    to say why: it reads every item.

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> storage = ListStorage(3)
    >>> storage.set([0, 1], [TensorDict({"episode": torch.tensor(0)}), 7])
    >>> try:
    ...     check_list_items(storage, [("episode", "traj_key")], "SliceSampler")
    ... except RuntimeError as err:
    ...     print(type(err).__name__, "slot 1" in str(err), str(err).split(": ")[1][:35])
    StorageItemsError True it is of type int, not a TensorDict
    """
    if not isinstance(storage, ListStorage) or not len(storage):
        return
    first = storage.get(0)
    held = set(first.keys(include_nested=True, leaves_only=True)) \
        if is_tensor_collection(first) else set()
    args: dict[Any, str] = {}  # the keys the first item holds, each with its argument
    for key, arg in keys:
        if key is not None and unravel_key(key) in held:
            args.setdefault(unravel_key(key), arg)
    found = first_unreadable_item(storage, list(args))
    if found is not None:
        slot, key, kind = found
        problem = f"it is of type {kind}, not a TensorDict" if key is None else \
            f"it has no entry {key_name(key)} ({args[key]}), which the item at slot 0 has"
        raise StorageItemsError(
            f"{owner} could not read the item at slot {slot} of the {type(storage).__name__}: "
            f"{problem}. Could not get a tensordict out of the storage, which is required for "
            f"{owner} to compute the trajectories: every item must be a TensorDict holding "
            "the entries the sampler reads.")


class SliceSampler(FragmentedSlicesMixin, TrajectorySyncMixin, Sampler):
    """Samples slices of trajectories: ``num_slices`` runs of consecutive steps per batch.

    A trajectory is a run of consecutive steps of one environment. Trajectories end where the
    trajectory id changes, after a step whose end flag (``end_key``) is set, at the newest
    written step (the write cursor: once the buffer has wrapped, the newest and oldest steps
    are not consecutive) and where older steps were overwritten. A slice never crosses a
    trajectory boundary and can end on a trajectory's last step.

    Each slice picks a trajectory uniformly among those long enough, then a start uniformly
    within it (TorchRL's sampling scheme). The sample holds the slices one after the other:
    ``sample.reshape(num_slices, -1)`` gives one slice per row. The last step of every slice
    is marked truncated in the info (``truncated_key``, written into the sample by
    :class:`~tdreplay.core.TensorDictReplayBuffer`), along with ``done`` (the stored done flag
    or the truncation) and ``terminated`` next to it. When the data has an ``init_key`` entry
    (``"is_init"``, written by TorchRL's ``InitTracker``), that entry of the sample is also
    ``True`` at the first step of every slice (as TorchRL: a recurrent module splitting the
    flat sample on it starts each slice anew).

    Interleaved trajectories (``fragmented=True``): when several collectors write into one
    buffer, consecutive steps of a trajectory need not occupy consecutive slots. Slices then
    follow the trajectory ids (``traj_key``) and step numbers (``step_key``) instead of the
    slots: a slice holds steps ``t, t + 1, ...`` of one trajectory wherever they are stored,
    in step order (so is the ``index`` of the sample). A step number missing from the buffer
    (overwritten or never written) splits a trajectory into runs sampled separately, each
    drawn uniformly as trajectories are. End flags play no part; ids and step numbers must be
    integers (one per step, steps non-negative), and a ``(trajectory, step)`` pair stored twice
    makes ``sample`` raise a ``RuntimeError`` naming it. One-dimensional storages only.

    Multi-dimensional storages (``LazyTensorStorage(N, ndim=2)`` filled with ``[envs, T]``
    batches, ``ndim=3`` with ``[workers, envs, T]``) are time-major, as TorchRL's: the buffer
    writes batches along ``T`` (its ``dim_extend``), one storage row per step, and each
    environment's steps run down the rows, so trajectories spanning several writes are sampled
    whole. Time order is row order, cut after the newest written row.

    Cost: trajectories are tracked as data is written (``O(steps written)``), so ``sample``
    costs ``O(batch)`` and does not grow with the buffer. Writes that do not follow the
    round-robin order (index assignment, max-value writers, a storage filled behind the
    sampler's back) make the next ``sample`` rebuild the bookkeeping from the storage once.

    Parameters
    ----------
    num_slices : int, optional
        Slices per batch; the batch size must be divisible by it. Exclusive with ``slice_len``.
    slice_len : int, optional
        Steps per slice; the batch size must be divisible by it. Exclusive with ``num_slices``:
        exactly one of the two is given, else a ``SliceSizeError`` (a ``TypeError``, as
        TorchRL raises, and a ``ValueError``; see the examples).
    end_key : NestedKey, optional
        Entry marking the last step of a trajectory. Defaults to ``("next", "done")``.
    end_keys : sequence of NestedKey, optional
        Several end entries, OR-ed (e.g. ``("next", "terminated")`` and ``("next",
        "truncated")``); those the data lacks are skipped. Exclusive with ``end_key``.
    traj_key, trajectory_key : NestedKey, optional
        Entry holding integer trajectory ids (``trajectory_key`` is an alias of ``traj_key``).
        As in TorchRL: when neither a trajectory key nor an end key is given,
        ``("collector", "traj_ids")`` is used if the data has it, else ``"episode"``, else the
        end key (:attr:`traj_key` then names the key found); a trajectory key the data lacks
        falls back to the end key, end keys the data lacks fall back to the trajectory ids.
        Giving both a trajectory key and end keys splits on either signal. With
        ``fragmented=True`` only the trajectory key counts: given, or detected as above
        (without the end-key fallback).
    step_key : NestedKey or None
        Entry holding each step's number within its trajectory (non-negative integers), read
        with ``fragmented=True`` only. Defaults to ``"step_count"`` (TorchRL's ``StepCounter``).
    fragmented : bool
        Cut slices along ``traj_key`` and ``step_key`` rather than along the storage slots
        (see above). Only with replacement: ``ends``, ``trajectories``, end keys without a
        trajectory key and ``step_key=None`` raise a ``ValueError``, ``span`` and ``compile``
        a ``NotImplementedError`` (as TorchRL). Defaults to ``False``.
    ends : torch.Tensor, optional
        Boolean end flags of every written step (flat slot order), for static datasets whose
        flags are known up front. Exclusive with the keys and with ``trajectories``. On a full
        flat storage, a last flag that is ``False`` means the last trajectory continues at
        slot 0: the flags alone cut the ring, not the newest written step (as TorchRL's),
        however the rows were written.
    trajectories : torch.Tensor, optional
        Integer trajectory ids of every written step, like ``ends`` (the last and first
        slots' ids equal: that trajectory continues at slot 0).
    cache_values : bool
        Accepted for TorchRL compatibility. Trajectory boundaries are always cached and kept
        up to date by the writes, so this changes nothing.
    truncated_key : NestedKey or None
        Info entry marking the last step of each slice (``None``: no truncation info).
        Defaults to ``("next", "truncated")``; ``done`` and ``terminated`` go next to it.
    init_key : NestedKey or None
        Entry marked ``True`` at the first step of every slice in the sample, OR-ed with the
        stored flags (nothing is made up when the data has no such entry). ``None``: the
        stored flags are left untouched (models that reset their state wherever ``is_init``
        is set). Defaults to ``"is_init"``.
    strict_length : bool
        ``True``: only trajectories at least as long as a slice are sampled (an error says so
        when there is none). ``False``: shorter trajectories give shorter slices, so the batch
        may hold fewer steps than asked for (use ``split_trajectories`` to pad them).
    compile : bool or dict
        Accepted for TorchRL compatibility; sampling is a handful of vectorised operations on
        the batch, there is nothing worth compiling.
    span : bool, int or (bool | int, bool | int)
        Let slices hang over the start (left) and/or end (right) of a trajectory, so the first
        and last steps are sampled as often as the others; the overhanging part is cut off
        (shorter slices). ``True`` allows an overhang of all but one step of a slice, an int
        ``i`` of at most ``i`` steps (and of all but one step of a slice shorter than ``i + 1``
        steps, ``strict_length=False``): every slice keeps at least one step.
    use_gpu : bool or torch.device
        Accepted for TorchRL compatibility; the bookkeeping is ``O(batch)`` on the CPU.
    pad_output : bool
        ``True`` (with ``strict_length=False``): pad every short slice to the slice length by
        repeating its last step, as TorchRL, so the batch has ``num_slices * slice_len``
        steps; ``info[("collector", "mask")]`` (bool, one per step) is ``False`` at the padding
        and truncation marks each slice's last real step. As in TorchRL, nothing is padded
        (and there is no mask) while no trajectory in the buffer is shorter than a slice,
        except with ``fragmented=True``, where every batch is padded (TorchRL's rule there).
    replacement : bool
        ``False`` makes a :class:`SliceSamplerWithoutReplacement` instead (the other arguments,
        e.g. ``drop_last`` and ``shuffle``, go to it), as in TorchRL. Defaults to ``True``.

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> from tdreplay.core import TensorDictReplayBuffer
    >>> from tdreplay.storages import LazyTensorStorage
    >>> type(SliceSampler(slice_len=4, replacement=False)).__name__
    'SliceSamplerWithoutReplacement'
    >>> rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100),
    ...                             sampler=SliceSampler(num_slices=2, traj_key="episode"),
    ...                             batch_size=8)
    >>> episode = torch.arange(3).repeat_interleave(10)          # 3 trajectories of 10 steps
    >>> _ = rb.extend(TensorDict({"episode": episode, "step": torch.arange(30) % 10}, [30]))
    >>> s = rb.sample()
    >>> slices = s.reshape(2, -1)
    >>> bool((slices["episode"] == slices["episode"][:, :1]).all())   # one trajectory per slice
    True
    >>> bool((slices["step"].diff(dim=1) == 1).all())                # consecutive steps
    True
    >>> s["next", "truncated"].view(2, 4)[:, -1].all().item()     # slice ends are truncated
    True

    Exactly one of ``num_slices`` and ``slice_len``:

    >>> try:
    ...     SliceSampler(num_slices=2, slice_len=4)
    ... except TypeError as err:                  # TorchRL's class (a ValueError too)
    ...     print(type(err).__name__, isinstance(err, ValueError))
    ...     print(err)
    SliceSizeError True
    exactly one of num_slices and slice_len must be given, got num_slices=2 and slice_len=4.
    """

    def __new__(cls, *args: Any, replacement: bool = True, **kwargs: Any) -> SliceSampler:
        # TorchRL's SliceSampler(replacement=False) is a SliceSamplerWithoutReplacement
        if cls is SliceSampler and isinstance(replacement, (bool, np.bool_)) \
                and not replacement:
            cls = SliceSamplerWithoutReplacement
        return super().__new__(cls)

    def __init__(
        self,
        *,
        num_slices: int | None = None,
        slice_len: int | None = None,
        end_key: NestedKey | None = None,
        traj_key: NestedKey | None = None,
        trajectory_key: NestedKey | None = None,
        step_key: NestedKey | None = "step_count",
        fragmented: bool = False,
        ends: torch.Tensor | None = None,
        trajectories: torch.Tensor | None = None,
        cache_values: bool = False,
        truncated_key: NestedKey | None = ("next", "truncated"),
        init_key: NestedKey | None = INIT_KEY,
        strict_length: bool = True,
        compile: bool | dict = False,
        span: bool | int | tuple[bool | int, bool | int] = False,
        use_gpu: bool | torch.device = False,
        replacement: bool = True,
        end_keys: Sequence[NestedKey] | None = None,
        pad_output: bool = False,
    ) -> None:
        check_replacement(replacement, type(self).__name__,
                          variant=isinstance(self, SamplerWithoutReplacement))
        cache_values = check_flag(cache_values, "cache_values")
        strict_length = check_flag(strict_length, "strict_length")
        pad_output = check_flag(pad_output, "pad_output")
        self._init_key = check_init_key(init_key)
        if pad_output and strict_length:
            raise ValueError("pad_output=True is incompatible with strict_length=True: only "
                             "short slices are padded, and strict_length=True makes none.")
        self.num_slices = check_count(num_slices, "num_slices", 1)
        self.slice_len = check_count(slice_len, "slice_len", 1)
        if (self.num_slices is None) == (self.slice_len is None):
            raise SliceSizeError("exactly one of num_slices and slice_len must be given, got "
                                 f"num_slices={num_slices!r} and slice_len={slice_len!r}.")
        traj_key = check_key(traj_key, "traj_key", optional=True)
        trajectory_key = check_key(trajectory_key, "trajectory_key", optional=True)
        end_key = check_key(end_key, "end_key", optional=True)
        truncated_key = check_key(truncated_key, "truncated_key", optional=True)
        if traj_key is not None and trajectory_key is not None and traj_key != trajectory_key:
            raise ValueError(f"traj_key={traj_key!r} and trajectory_key={trajectory_key!r} are "
                             "aliases of one argument: give one of them.")
        traj_key = traj_key if traj_key is not None else trajectory_key
        if end_key is not None and end_keys is not None:
            raise ArgumentConflictError("end_key and end_keys are exclusive arguments: pass one "
                                        "key as end_key, or several (OR-ed) as end_keys.")
        if end_keys is not None:
            if isinstance(end_keys, (str, bytes)) or not isinstance(end_keys, Sequence) \
                    or not end_keys:
                raise ValueError(f"end_keys must be a non-empty sequence of keys, got "
                                 f"{end_keys!r}.")
            self.end_keys: tuple[Any, ...] | None = tuple(check_key(k, "end_keys")
                                                          for k in end_keys)
        else:
            self.end_keys = None
        if (ends is not None or trajectories is not None) and (
                traj_key is not None or end_key is not None or end_keys is not None):
            raise ArgumentConflictError("ends/trajectories give the trajectories directly: they "
                                        "cannot be combined with end_key, end_keys or traj_key.")
        if ends is not None and trajectories is not None:
            raise ValueError("ends and trajectories are exclusive: give one of them.")
        self._static_ends = check_static(ends, "ends")
        self._static_traj = check_static(trajectories, "trajectories")
        self._explicit_traj = traj_key is not None
        self._explicit_end = end_key is not None or end_keys is not None
        self.end_key = end_key if end_key is not None else _DEFAULT_END_KEY
        self._end_keys = self.end_keys if self.end_keys is not None else (self.end_key,)
        self.traj_key = traj_key if traj_key is not None else _DEFAULT_TRAJ_KEY
        self.cache_values = cache_values
        self.truncated_key = truncated_key
        self._done_keys = (None, None) if truncated_key is None else (
            _replace_last(self.truncated_key, "done"),
            _replace_last(self.truncated_key, "terminated"))
        self.strict_length = strict_length
        self.pad_output = pad_output
        self.compile = compile
        self.span = _normalize_span(span)
        self._fragmented, self._step_key = check_fragmented_arguments(
            fragmented, step_key, traj_key=traj_key, end_key=end_key, end_keys=end_keys,
            ends=ends, trajectories=trajectories, span=self.span, compile=compile)
        self.use_gpu = use_gpu
        self._fragments = FragmentedIndex()
        self._index = TrajectoryIndex(track_slots=self._tracks_slots)
        self._entries = StorageEntries()
        self._signals: Signals | None = None

    _tracks_slots = False

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_entries"] = StorageEntries()  # views of the storage are not pickled
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        # samplers pickled before init_key / fragmented existed: their defaults
        for name, default in (("_init_key", INIT_KEY), ("_fragmented", False),
                              ("_step_key", "step_count")):
            state.setdefault(name, default)
        state.setdefault("_fragments", FragmentedIndex())
        self.__dict__.update(state)

    # ---- writes ------------------------------------------------------------------------------
    def extend(self, index: torch.Tensor) -> None:
        if not self._fragmented:  # (the runs follow the storage's revision)
            self._index.note_write(index)

    def check_write(self, data: Any) -> None:
        """Refuse trajectory ids that are not whole numbers (``0.5``, ``nan``) before they
        are written, with a ``ValueError`` naming the key: stored, they would make every later
        sample raise. The ids checked are those the sampler reads: ``traj_key``'s when given,
        else the first of the keys it detects that ``data`` holds. With ``fragmented=True``,
        ids and step numbers that are not integers (``TypeError``) and negative step numbers
        (``ValueError``) are refused."""
        if self._fragmented:
            self._check_fragmented_write(data)
            return
        if self._static_traj is not None or self._static_ends is not None \
                or not is_tensor_collection(data):
            return
        for key in traj_key_candidates(self.traj_key if self._explicit_traj else None):
            ids = data.get(key, None)
            if ids is not None:
                if isinstance(ids, torch.Tensor) and ids.is_floating_point():
                    whole_ids(ids.reshape(-1), f"the trajectory key {key_name(key)}")
                return

    def mark_update(self, index: torch.Tensor, *, storage: Storage | None = None) -> None:
        self._rewritten()

    def mark_edited(self, keys: list[NestedKey] | None = None) -> None:
        """Entries edited in place: recompute the trajectories if their signals may have changed."""
        if self._fragmented:
            if self._fragment_keys_edited(keys):
                self._rewritten()
        elif self._static_traj is None and self._static_ends is None \
                and touches(keys, [self.traj_key, *AUTO_TRAJ_KEYS, *self._end_keys]):
            self._rewritten()

    def _rewritten(self) -> None:
        """Written steps changed in place: the trajectories are recomputed at the next batch."""
        self._index.note_update()
        self._fragments.reset()

    def empty(self) -> None:
        self._index.reset()
        self._fragments.reset()
        self._entries.invalidate()
        self._signals = self._restored_signals = None

    def can_sample(self, storage: Storage, batch_size: int) -> bool:
        """Whether a batch of ``batch_size`` steps can be drawn from ``storage`` now (what
        ``rb.can_sample()`` asks), as TorchRL answers it: some stored trajectory can hold a
        slice. With ``strict_length=True``, one at least as long as a slice; with
        ``strict_length=False``, any. ``False`` on an empty storage and on one whose
        trajectories cannot be told yet (no trajectory key nor end key stored). A batch size
        that is not divisible by ``num_slices`` / ``slice_len`` raises the
        :class:`SliceBatchError` of :meth:`sample` (a ``ValueError``, and the
        ``RuntimeError`` TorchRL's raises). ``span`` is not counted (as TorchRL).

        The sampler is left as it was (its :meth:`state_dict` too): when writes are pending,
        the trajectories are found on a copy of its index (what the next ``sample`` redoes),
        ``O(steps written since the last batch)``, or ``O(buffer)`` after writes that make
        the index rebuild (as TorchRL's, which reads the whole buffer every time).

        Examples
        --------
        >>> from tensordict import TensorDict
        >>> from tdreplay.core import TensorDictReplayBuffer
        >>> from tdreplay.storages import LazyTensorStorage
        >>> rb = TensorDictReplayBuffer(storage=LazyTensorStorage(20), batch_size=8,
        ...                             sampler=SliceSampler(slice_len=4, traj_key="episode"))
        >>> rb.can_sample()
        False
        >>> _ = rb.extend(TensorDict({"episode": torch.tensor([0, 0, 0, 1, 1])}, [5]))
        >>> rb.can_sample()  # trajectories of 3 and 2 steps, slices of 4 (strict_length)
        False
        >>> _ = rb.extend(TensorDict({"episode": torch.tensor([1, 1])}, [2]))
        >>> rb.can_sample(), rb.can_sample(4)  # trajectory 1 has 4 steps now
        (True, True)
        """
        if len(storage) == 0:
            return False
        if self._fragmented:
            return self._can_sample_fragmented(storage, batch_size)
        _, seq_len = slice_shape(batch_size, self.num_slices, self.slice_len)
        index = self._peek(storage)
        if index is None:
            return False
        lengths = index.rec[index.live_records(), LEN]
        return bool((lengths >= (seq_len if self.strict_length else 1)).any())

    # ---- sampling --------------------------------------------------------------------------------
    def _check_sampleable(self, storage: Storage, seq_len: int) -> None:
        """Refuse a batch no stored trajectory could hold: :class:`SliceBatchError` (a
        ``ValueError`` and TorchRL's ``RuntimeError``) for ``strict_length`` slices longer
        than the buffer (:meth:`_strict_steps` steps); ``ValueError`` for a span as long as
        a slice."""
        n = check_not_empty(storage)
        need = self._strict_steps(seq_len) if self.strict_length else 0
        if need > storage.max_size:
            raise SliceBatchError(f"slices of {seq_len} steps are longer than the whole buffer "
                                  f"(max_size={storage.max_size}): use shorter slices or "
                                  "strict_length=False.")
        if need > n:
            hint = ("; if the buffer is fed [envs, T] batches, a storage of ndim=1 holds each "
                    "environment's row as one item: build it with ndim=2 to slice along T"
                    if storage.ndim == 1 else "")
            raise SliceBatchError(f"slices of {seq_len} steps are longer than the {n} steps in "
                                  f"the buffer (strict_length=True){hint}.")
        for side, value in zip(("left", "right"), self.span):
            if value is not True and value and value >= seq_len:
                raise ValueError(f"span on the {side} ({value}) must be smaller than the slice "
                                 f"length ({seq_len}).")

    def _strict_steps(self, seq_len: int) -> int:
        """Steps a trajectory needs to hold a ``strict_length`` slice of ``seq_len`` steps:
        all of them (as TorchRL's ``SliceSampler``, whatever the ``span``)."""
        return seq_len

    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict[str, Any]]:
        if self._fragmented:
            return self._sample_fragmented(storage, batch_size)
        num_slices, seq_len = slice_shape(batch_size, self.num_slices, self.slice_len)
        self._check_sampleable(storage, seq_len)
        index = self._sync(storage)
        records = draw_trajectories(index, num_slices, seq_len, self.strict_length,
                                    self._randint)
        return self._slices(storage, index, records, seq_len, self.span)

    def _randint(self, high: int, n: int) -> np.ndarray:
        return torch.randint(high, (n,), generator=self._rng).numpy()

    def _slices(self, storage: Storage, index: TrajectoryIndex, records: np.ndarray,
                seq_len: int, span: tuple[bool | int, bool | int]
                ) -> tuple[torch.Tensor, dict[str, Any]]:
        """Slots of one slice per record (random start), and the truncation info."""
        slots, ends, padded = self._cut_slices(index, records, seq_len, span)
        return self._output(storage, slots, ends, seq_len if padded else None)

    def _cut_slices(self, index: TrajectoryIndex, records: np.ndarray, seq_len: int,
                    span: tuple[bool | int, bool | int]
                    ) -> tuple[torch.Tensor, np.ndarray, bool]:
        """Slots of one slice per record (random start), laid end to end; the place of each
        slice's last step in them; whether the batch is padded (``pad_output`` and, as in
        TorchRL, a trajectory in the buffer shorter than a slice)."""
        rec = index.rec
        k = records.size
        chosen = rec[records]
        lengths = chosen[:, LEN]
        u = torch.rand(k, generator=self._rng, dtype=torch.float64).numpy()
        if self.strict_length and not (span[0] or span[1]):
            # the common case: every slice has seq_len steps
            rel = (u * (lengths - (seq_len - 1))).astype(np.int64)
            seq = None
        else:
            seq = np.minimum(lengths, seq_len) if not self.strict_length else \
                np.full(k, seq_len, dtype=np.int64)
            rel, seq = span_starts(u, lengths, seq, span)
        slots, ends, _ = slice_slots(index, chosen[:, LANE], chosen[:, START] + rel, seq,
                                      seq_len)
        # as TorchRL: padded (with a mask) when the buffer holds a trajectory shorter than a slice
        short = self.pad_output and bool((rec[index.live_records(), LEN] < seq_len).any())
        return slots, ends, short

    @property
    def init_key(self) -> NestedKey | None:
        """The entry marked ``True`` at slice starts (OR-ed with the stored flags); ``None``:
        the stored flags are left as they are.

        Examples
        --------
        >>> SliceSampler(slice_len=2).init_key, SliceSampler(slice_len=2, init_key=None).init_key
        ('is_init', None)
        """
        return self._init_key

    def _output(self, storage: Storage, slots: torch.Tensor, ends: np.ndarray,
                pad_to: int | None = None) -> tuple[torch.Tensor, dict[str, Any]]:
        """Slots and info of a batch of slices: truncation, ``is_init`` marks and the padding
        to ``pad_to`` steps (see :func:`~._slice_output.slice_info`)."""
        try:
            return slice_info(self._entries, storage, slots, ends,
                              truncated_key=self.truncated_key, done_keys=self._done_keys,
                              pad_to=pad_to, init_key=self._init_key)
        except Exception:  # (a list storage's items: say which one, else the error as it is)
            check_list_items(storage, [(self._init_key, "init_key"),
                                       (self._done_keys[0], "truncated_key"),
                                       (self._done_keys[1], "truncated_key")],
                             type(self).__name__)
            raise

    def _read_block(self, storage: Storage, start: int, stop: int
                    ) -> tuple[np.ndarray | None, np.ndarray | None]:
        """Trajectory signals of slots ``[start, stop)``; a list storage item that cannot be
        read raises :class:`StorageItemsError` naming it (the index is left as it was)."""
        try:
            return super()._read_block(storage, start, stop)
        except Exception:
            traj, ends = self._signals if self._signals is not None else (None, None)
            end_arg = "end_keys" if self.end_keys is not None else "end_key"
            check_list_items(storage, [(traj, "traj_key"), *((k, end_arg) for k in ends or ())],
                             type(self).__name__)
            raise

    # ---- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"index": self._index_state()}

    def check_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().check_state_dict(state_dict)
        TrajectoryIndex.check_state_dict(state_dict["index"])

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.check_state_dict(state_dict)
        self._load_index(state_dict["index"])

    def _load_index(self, state: dict[str, Any]) -> None:
        """Load the index state of a whole state this sampler checked already."""
        self._index.install(state)
        self._note_restored_signals(state)
        self._entries.invalidate()
        self._signals = None
        self._fragments.reset()  # (the runs are read from the storage again)

    def _repr_args(self) -> str:
        size = f"num_slices={self.num_slices}" if self.num_slices is not None \
            else f"slice_len={self.slice_len}"
        fragmented = f", fragmented=True, step_key={self._step_key!r}" if self._fragmented \
            else ""
        return (f"{size}, end_key={self.end_key!r}, traj_key={self.traj_key!r}{fragmented}, "
                f"truncated_key={self.truncated_key!r}, init_key={self._init_key!r}, "
                f"strict_length={self.strict_length}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._repr_args()}, span={self.span})"


class SliceSamplerWithoutReplacement(SliceSampler, SamplerWithoutReplacement):
    """Slices without replacement: each trajectory gives one slice per epoch.

    An epoch is a (shuffled) pass over the trajectories in the buffer when it starts; each
    batch takes the next ``num_slices`` of them and cuts one slice at a random start in each,
    so no step is sampled twice within an epoch and no trajectory appears twice in a batch.
    With ``strict_length=True`` trajectories shorter than a slice are left out of the epoch.
    :attr:`ran_out` turns True with the batch that ends an epoch (ending iteration over the
    buffer); the last batch of an epoch may hold fewer slices unless ``drop_last``. As in
    TorchRL, writing to the buffer (extend or index assignment) starts a new epoch.

    Parameters
    ----------
    drop_last : bool
        Drop the last batch of an epoch when it would hold fewer than ``num_slices`` slices: a
        batch is always complete. When even a new epoch holds fewer than ``num_slices``
        trajectories, :meth:`sample` raises a ``BatchLargerThanBufferError`` (TorchRL's
        ``ValueError``) and changes nothing.
    shuffle : bool
        Visit trajectories in random order (``False``: in storage order of their first step).
    **kwargs
        As :class:`SliceSampler` (``num_slices`` / ``slice_len``, keys and ``end_keys``, ``ends`` /
        ``trajectories``, ``truncated_key``, ``init_key``, ``strict_length``, ``cache_values``,
        ``compile``, ``use_gpu``); ``span`` is not supported (each trajectory is visited once),
        nor are ``fragmented`` and ``step_key`` (a ``TypeError``, as in TorchRL).
        ``replacement`` is TorchRL's: only ``False`` is accepted.

    It is a :class:`SamplerWithoutReplacement` too (``isinstance`` holds, as in TorchRL).

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> from tdreplay.core import TensorDictReplayBuffer
    >>> from tdreplay.storages import LazyTensorStorage
    >>> sampler = SliceSamplerWithoutReplacement(slice_len=4, traj_key="episode")
    >>> rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), sampler=sampler,
    ...                             batch_size=8)
    >>> _ = rb.extend(TensorDict({"episode": torch.arange(5).repeat_interleave(6)}, [30]))
    >>> seen = [batch["episode"].view(-1, 4)[:, 0].tolist() for batch in rb]
    >>> [len(x) for x in seen], sorted(sum(seen, []))      # 5 trajectories, 2 slices a batch
    ([2, 2, 1], [0, 1, 2, 3, 4])
    """

    finite_epochs = True
    stateful_draws = True  # the epoch's position

    def __init__(
        self,
        *,
        num_slices: int | None = None,
        slice_len: int | None = None,
        drop_last: bool = False,
        end_key: NestedKey | None = None,
        traj_key: NestedKey | None = None,
        trajectory_key: NestedKey | None = None,
        ends: torch.Tensor | None = None,
        trajectories: torch.Tensor | None = None,
        cache_values: bool = False,
        truncated_key: NestedKey | None = ("next", "truncated"),
        init_key: NestedKey | None = INIT_KEY,
        strict_length: bool = True,
        shuffle: bool = True,
        compile: bool | dict = False,
        use_gpu: bool | torch.device = False,
        replacement: bool = False,
        end_keys: Sequence[NestedKey] | None = None,
    ) -> None:
        drop_last = check_flag(drop_last, "drop_last")
        shuffle = check_flag(shuffle, "shuffle")
        SliceSampler.__init__(self, num_slices=num_slices, slice_len=slice_len, end_key=end_key,
                              traj_key=traj_key, trajectory_key=trajectory_key, ends=ends,
                              trajectories=trajectories, cache_values=cache_values,
                              truncated_key=truncated_key, init_key=init_key,
                              strict_length=strict_length, compile=compile, span=False,
                              use_gpu=use_gpu, replacement=replacement, end_keys=end_keys)
        self.drop_last = drop_last
        self.shuffle = shuffle
        self._reset_epoch()

    def _reset_epoch(self) -> None:
        self._perm = np.empty(0, dtype=np.int64)  # record ids of the epoch, in visiting order
        self._pos = 0
        self._epoch_len = 0  # slice length the epoch was filtered for
        self._ran_out = False
        self._stale = True  # written since the epoch began: the next batch starts a new one
        self._numbering = -1  # the index's record numbering the epoch's ids belong to

    def extend(self, index: torch.Tensor) -> None:
        super().extend(index)
        self._stale = True

    def _rewritten(self) -> None:
        super()._rewritten()
        self._stale = True

    def empty(self) -> None:
        super().empty()
        self._reset_epoch()

    @property
    def ran_out(self) -> bool:
        return self._ran_out

    @property
    def len_storage(self) -> int:
        """Number of trajectories found in the buffer at the last :meth:`sample` (TorchRL's
        ``len_storage``, the items its epochs are drawn from); ``0`` before the first one and
        after ``empty``. Read-only.

        Examples
        --------
        >>> from tensordict import TensorDict
        >>> from tdreplay.storages import LazyTensorStorage
        >>> storage = LazyTensorStorage(20)
        >>> storage.set(torch.arange(9), TensorDict({"episode": torch.arange(9) // 3}, [9]))
        >>> sampler = SliceSamplerWithoutReplacement(slice_len=3, traj_key="episode")
        >>> sampler.len_storage
        0
        >>> _ = sampler.sample(storage, 3)
        >>> sampler.len_storage
        3
        """
        return self._index.num_trajectories

    def draw_mark(self) -> Any:  # (not the epoch of a SamplerWithoutReplacement)
        """The epoch's trajectories (an array a draw replaces, never changes), position, slice
        length, ``ran_out`` and staleness: what :meth:`undo_draws` puts back. The trajectory
        index a draw brings up to date with the writes is not (see
        :meth:`~tdreplay.core.Sampler.draw_mark`).

        Examples
        --------
        >>> from tensordict import TensorDict
        >>> from tdreplay.storages import LazyTensorStorage
        >>> storage = LazyTensorStorage(20)
        >>> storage.set(torch.arange(20), TensorDict({"episode": torch.arange(20) // 5}, [20]))
        >>> sampler = SliceSamplerWithoutReplacement(slice_len=5, traj_key="episode",
        ...                                          shuffle=False)
        >>> mark = sampler.draw_mark()
        >>> first = sampler.sample(storage, 10)[0].tolist()
        >>> sampler.undo_draws(mark)  # e.g. the batch's transform raised
        >>> sampler.sample(storage, 10)[0].tolist() == first
        True
        """
        return self._perm, self._pos, self._epoch_len, self._ran_out, self._stale, self._numbering

    def undo_draws(self, mark: Any) -> None:
        """Back to the epoch and position of ``mark`` (see :meth:`draw_mark`)."""
        (self._perm, self._pos, self._epoch_len, self._ran_out, self._stale,
         self._numbering) = mark

    def _new_epoch(self, index: TrajectoryIndex, seq_len: int, num_slices: int) -> None:
        live = index.live_records().copy()
        if self.strict_length:
            live = live[index.rec[live, LEN] >= seq_len]
            if live.size == 0:
                raise no_trajectory_error(index, seq_len)
        if self.drop_last and live.size < num_slices:
            # (before the shuffle: a refused batch draws no random number)
            raise self._too_few_trajectories(live.size, num_slices, seq_len)
        if self.shuffle:
            live = live[torch.randperm(live.size, generator=self._rng).numpy()]
        else:
            rec = index.rec
            first = index.slots_of(rec[live, LANE], rec[live, START])
            live = live[np.argsort(first, kind="stable")]
        self._perm, self._pos, self._epoch_len, self._stale = live, 0, seq_len, False
        self._numbering = index.numbering

    def _too_few_trajectories(self, count: int, num_slices: int, seq_len: int
                              ) -> BatchLargerThanBufferError:
        """The error of a ``drop_last`` batch of ``num_slices`` slices that an epoch of
        ``count`` trajectories cannot fill."""
        which = f"trajectories of at least {seq_len} steps (strict_length=True)" \
            if self.strict_length else "trajectories"
        return BatchLargerThanBufferError(
            f"The batch size ({num_slices} slices of {seq_len} steps) is greater than the number "
            f"of {which} in the buffer ({count}): with drop_last=True a batch takes "
            f"num_slices={num_slices} distinct trajectories, so no complete batch can be drawn. "
            "Use fewer slices per batch (num_slices, or a smaller batch with slice_len), "
            "drop_last=False (short batches) or a SliceSampler (with replacement).")

    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict[str, Any]]:
        """Draw the next ``num_slices`` trajectories of the epoch and one slice in each.

        With ``drop_last=True``, a batch is always complete: when even a new epoch holds
        fewer trajectories than ``num_slices`` (of at least a slice's length with
        ``strict_length``), a :class:`~tdreplay.core.BatchLargerThanBufferError` (a
        ``ValueError``, as TorchRL raises, and a ``RuntimeError``) is raised and the epoch,
        position and ``ran_out`` are left as they were.

        Examples
        --------
        >>> from tensordict import TensorDict
        >>> from tdreplay.storages import LazyTensorStorage
        >>> storage = LazyTensorStorage(20)
        >>> storage.set(torch.arange(10), TensorDict({"episode": torch.arange(10) // 5}, [10]))
        >>> sampler = SliceSamplerWithoutReplacement(num_slices=3, traj_key="episode",
        ...                                          drop_last=True)
        >>> try:
        ...     sampler.sample(storage, 6)  # 3 slices, but only 2 trajectories
        ... except ValueError as err:
        ...     print(type(err).__name__, "drop_last=True" in str(err))
        BatchLargerThanBufferError True
        >>> sampler.num_slices = 2
        >>> sampler.sample(storage, 6)[0].numel()
        6
        """
        mark = self.draw_mark()
        try:
            return self._draw_batch(storage, batch_size)
        except BaseException:
            self.undo_draws(mark)  # a refused batch leaves the epoch as it was
            raise

    def _draw_batch(self, storage: Storage, batch_size: int
                    ) -> tuple[torch.Tensor, dict[str, Any]]:
        num_slices, seq_len = slice_shape(batch_size, self.num_slices, self.slice_len)
        self._check_sampleable(storage, seq_len)
        index = self._sync(storage)
        if index.num_trajectories == 0:
            raise RuntimeError("the buffer holds no trajectory to sample from.")
        stale = self._epoch_is_stale()  # (after the sync, which may have rebuilt the index)
        if not stale and self.strict_length and seq_len > self._epoch_len:
            # longer slices than the epoch was built for: drop the trajectories now too short
            rest = self._perm[self._pos:]
            self._perm, self._pos = rest[index.rec[rest, LEN] >= seq_len], 0
            self._epoch_len = seq_len
        remaining = self._perm.size - self._pos
        if stale or remaining == 0 or (self.drop_last and remaining < num_slices):
            self._new_epoch(index, seq_len, num_slices)
        records = self._perm[self._pos: self._pos + num_slices]
        self._pos += records.size
        remaining = self._perm.size - self._pos
        self._ran_out = remaining == 0 or (self.drop_last and remaining < num_slices)
        return self._slices(storage, index, records, seq_len, (False, False))

    def can_sample(self, storage: Storage, batch_size: int) -> bool:
        """Whether ``rb.can_sample()`` is answered yes, as TorchRL's
        ``SliceSamplerWithoutReplacement`` answers it (its :class:`SamplerWithoutReplacement`
        rule; the trajectories are not looked at): with ``drop_last``, at least
        ``batch_size`` steps are stored; else any step. So, as in TorchRL, ``True`` does not
        promise that a slice fits (``strict_length=True`` and every trajectory shorter than a
        slice: :meth:`sample` raises). Changes nothing.

        Examples
        --------
        >>> from tdreplay.storages import LazyTensorStorage
        >>> storage = LazyTensorStorage(20)
        >>> storage.set(torch.arange(6), torch.zeros(6))
        >>> sampler = SliceSamplerWithoutReplacement(slice_len=2, drop_last=True)
        >>> sampler.can_sample(storage, 6), sampler.can_sample(storage, 8)
        (True, False)
        """
        n = len(storage)
        return n >= batch_size if self.drop_last else n > 0

    def _epoch_is_stale(self) -> bool:
        """Whether the next batch starts a new epoch: written since, or the index renumbered
        its trajectories (rebuilt) since the epoch took their ids."""
        return self._stale or self._index.numbering != self._numbering

    def state_dict(self) -> dict[str, Any]:
        return {
            "index": self._index_state(),
            "epoch": torch.from_numpy(self._perm.copy()),
            "epoch_meta": torch.tensor([self._pos, self._epoch_len, int(self._ran_out),
                                        int(self._epoch_is_stale())], dtype=torch.long),
        }

    def check_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().check_state_dict(state_dict)
        perm, meta = state_dict["epoch"], state_dict["epoch_meta"]
        if not isinstance(perm, torch.Tensor) or perm.dtype != torch.long or perm.ndim != 1:
            raise ValueError("SliceSamplerWithoutReplacement state 'epoch' must be a 1-d int64 "
                             "tensor.")
        if not isinstance(meta, torch.Tensor) or meta.shape != (4,):
            raise ValueError("SliceSamplerWithoutReplacement state 'epoch_meta' must hold 4 "
                             "ints.")
        if not 0 <= int(meta[0]) <= perm.numel():
            raise ValueError(f"state 'epoch_meta' position {int(meta[0])} is outside the epoch "
                             f"of {perm.numel()} trajectories.")
        high = int(state_dict["index"]["counters"][1])
        stale = bool(meta[3])  # (a stale epoch is never read: its ids may be void)
        if not stale and perm.numel() and (int(perm.min()) < 0 or int(perm.max()) >= high):
            raise ValueError("state 'epoch' names trajectories that the index does not hold.")
        if not stale and torch.unique(perm).numel() != perm.numel():
            raise ValueError("state 'epoch' names a trajectory twice: an epoch draws each "
                             "trajectory once.")
        if not stale:  # every trajectory a slice fits in is in the epoch, drawn or to come
            live = state_dict["index"]["dense"]
            if self.strict_length:
                live = live[state_dict["index"]["records"][live, LEN] >= int(meta[1])]
            left_out = live[~torch.isin(live, perm)]
            if left_out.numel():
                raise ValueError(f"state 'epoch' leaves out {left_out.numel()} of the index's "
                                 "trajectories: an epoch draws each trajectory once.")

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.check_state_dict(state_dict)
        self._load_index(state_dict["index"])
        self._numbering = self._index.numbering  # the saved ids are of the saved index
        self._perm = state_dict["epoch"].numpy().copy()
        pos, epoch_len, ran_out, stale = (int(x) for x in state_dict["epoch_meta"])
        self._pos, self._epoch_len, self._ran_out, self._stale = pos, epoch_len, bool(ran_out), \
            bool(stale)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self._repr_args()}, drop_last={self.drop_last}, "
                f"shuffle={self.shuffle})")
