"""Offline-to-online RL: an immutable offline dataset plus a growing online buffer.

:class:`OfflineToOnlineReplayBuffer` samples every batch with a fixed share of offline rows
(annealed towards 0 as training goes on); :func:`prefill_replay_buffer` copies a dataset into
an ordinary buffer instead. Both are TorchRL's
(``torchrl.data.replay_buffers.offline_to_online``), with the differences their docstrings
list.
"""

from __future__ import annotations

import math
import numbers
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
from tensordict import is_tensor_collection

from tdreplay.core import CheckpointError, ReplayBuffer, Storage, TensorDictReplayBuffer
from tdreplay.core.buffer_draw import reads_undone_on_failure
from tdreplay.core.checkpoint import open_checkpoint, read_json, write_checkpoint, write_json
from tdreplay.core.trajectory_bounds import marked_truncated
from tdreplay.core.utils import check_batch_size, check_instance, check_required_count
from tdreplay.storages import LazyTensorStorage

from ._offline_state import (
    check_offline_dataset,
    check_offline_sampler_state,
    load_offline_sampler_state,
    offline_dataset_identity,
    offline_sampler_state,
    read_offline_sampler_state,
    write_offline_sampler_state,
)
from .registry import load_dataset

__all__ = ["OfflineToOnlineReplayBuffer", "prefill_replay_buffer"]

#: the checkpoint's own file (beside the online buffer's checkpoint, ``online/``)
_META = "offline_to_online.json"
_ONLINE = "online"
_FORMAT = 1
_KIND = "OfflineToOnlineReplayBuffer"

_Buffer = TypeVar("_Buffer")


def _check_real(value: Any, name: str) -> float:
    """``value`` as a finite float: ``TypeError`` naming ``name`` unless it is a real number
    (bools are refused), ``ValueError`` for NaN or infinity."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} ({value!r}).")
    out = float(value)
    if not math.isfinite(out):
        raise ValueError(f"{name} must be finite, got {value!r}.")
    return out


def _check_fraction(value: Any, name: str = "offline_fraction") -> float:
    """``value`` as a float in ``(0, 1)`` (``TypeError`` / ``ValueError`` naming ``name``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number in (0, 1), got {type(value).__name__} "
                        f"({value!r}).")
    out = float(value)
    if not 0.0 < out < 1.0:  # (NaN fails too)
        raise ValueError(f"{name} must be in (0, 1), got {value!r}.")
    return out


def _check_fractions(current: Any, base: Any) -> tuple[float, float]:
    """A saved ``(offline_fraction, base_offline_fraction)``, checked: the base in ``(0, 1)``,
    the current (annealed) one in ``[0, base]``; ``ValueError`` naming the field."""
    base_f = _check_fraction(base, "base_offline_fraction")
    if isinstance(current, bool) or not isinstance(current, numbers.Real):
        raise ValueError(f"offline_fraction must be a number, got {type(current).__name__} "
                         f"({current!r}).")
    current_f = float(current)
    if not 0.0 <= current_f <= base_f:
        raise ValueError(f"offline_fraction must be in [0, base_offline_fraction = {base_f}], "
                         f"got {current!r}.")
    return current_f, base_f


def _entries(td: Any) -> set[Any]:
    return set(td.keys(include_nested=True, leaves_only=True))


def _listed(keys: set[Any]) -> str:
    """``keys`` sorted, as ``['a', ('next', 'b')]``."""
    return "[" + ", ".join(repr(key) for key in sorted(keys, key=str)) + "]"


def _concat(offline: Any, online: Any) -> Any:
    """The offline rows then the online rows, as one batch along dim 0."""
    if is_tensor_collection(offline) and is_tensor_collection(online):
        only_offline = _entries(offline) - _entries(online)
        only_online = _entries(online) - _entries(offline)
        if only_offline or only_online:
            raise KeyError(
                "the offline and online samples have different entries and cannot be "
                f"concatenated: only the offline dataset's samples have "
                f"{_listed(only_offline)}, only the online buffer's {_listed(only_online)}. "
                "Make both hold the same entries (e.g. a "
                "transform that excludes the extra ones).")
        try:
            return torch.cat([offline, online], dim=0)
        except RuntimeError as err:  # (torch.cat's error names no entry)
            _raise_other_row_shapes(offline, online, err)
            raise
    if isinstance(offline, torch.Tensor) and isinstance(online, torch.Tensor):
        return torch.cat([offline, online], dim=0)
    if isinstance(offline, list) and isinstance(online, list):
        return offline + online
    raise TypeError(
        f"cannot concatenate an offline sample of type {type(offline).__name__} with an online "
        f"sample of type {type(online).__name__}: both must be TensorDicts, tensors or lists.")


def _share(buffer: Any, rows: int, what: str) -> Any:
    """``buffer.sample(rows)``; an error it raises gets a note saying that ``rows`` is ``what``
    (a share of the batch the caller did not ask for by that size: a slice sampler refusing
    ``batch_size=5`` was a riddle for a batch of 16). Python 3.10 has no notes: the error
    goes as it is there."""
    try:
        return buffer.sample(rows)
    except Exception as err:
        if sys.version_info >= (3, 11):
            err.add_note(f"(sampling {what} of an OfflineToOnlineReplayBuffer batch)")
        raise


def _raise_other_row_shapes(offline: Any, online: Any, err: Exception) -> None:
    """``ValueError`` naming the entry whose rows differ in shape between the two dense
    samples that ``torch.cat`` refused (``err``); nothing for others (ragged rows)."""
    for key in _entries(offline):
        try:
            mine, theirs = offline.get(key), online.get(key)
        except RuntimeError:  # a lazy stack of ragged rows: no one shape to name
            return
        if mine.shape[offline.batch_dims:] != theirs.shape[online.batch_dims:]:
            raise ValueError(
                f"the offline and online samples cannot be concatenated: entry {key!r} has "
                f"rows of shape {tuple(mine.shape[offline.batch_dims:])} in the offline dataset "
                f"and {tuple(theirs.shape[online.batch_dims:])} in the online buffer. Write "
                "online data shaped as the dataset's rows.") from err


class OfflineToOnlineReplayBuffer:
    """An immutable offline dataset combined with a growing online replay buffer.

    As TorchRL's ``OfflineToOnlineReplayBuffer``: :meth:`extend` writes to the online buffer
    only, the offline dataset is never modified. :meth:`sample` draws **exactly**
    ``round(offline_fraction * batch_size)`` rows from the offline dataset and the rest from
    the online buffer, and returns one flat batch of ``batch_size`` rows, the offline rows
    first. While the online buffer is empty (or when the offline share rounds to the whole
    batch) every row comes from the offline dataset; once :meth:`anneal` has brought the share
    to 0, every row comes from the online buffer.

    Parameters
    ----------
    offline_dataset : ReplayBuffer or str
        The offline data: any buffer with ``sample(n)`` and ``len()`` (e.g. a
        :class:`~tdreplay.datasets.MinariExperienceReplay`), or a prefixed id such as
        ``"minari:mujoco/hopper/expert-v0"`` built with :func:`~tdreplay.datasets.load_dataset`
        (``batch_size`` and ``**dataset_kwargs`` forwarded to it).

    Keyword Arguments
    -----------------
    online_storage : Storage, optional
        The online buffer's storage (exclusive with ``online_capacity``).
    online_capacity : int, optional
        Shorthand for ``online_storage=LazyTensorStorage(online_capacity)``.
    offline_fraction : float
        Share of each batch drawn from the offline dataset, in ``(0, 1)``. Default ``0.5``.
    batch_size : int, optional
        Default batch size of :meth:`sample`. Needed when ``offline_dataset`` is a string:
        it is forwarded to the dataset.
    transform : callable, optional
        Applied to each concatenated batch.
    **dataset_kwargs
        Forwarded to :func:`~tdreplay.datasets.load_dataset` when ``offline_dataset`` is a
        string (e.g. ``root=``, ``download=``); refused otherwise.

    Raises
    ------
    ValueError
        Both or neither of ``online_storage`` / ``online_capacity``; ``offline_fraction``
        outside ``(0, 1)``; ``dataset_kwargs`` with a dataset that is not a string; no
        ``batch_size`` for a string dataset; a batch size or capacity that is not positive;
        an ``online_storage`` that is the offline dataset's own storage.
    TypeError
        An argument of the wrong type (a bool or a string ``offline_fraction``, an
        ``online_storage`` that is no :class:`~tdreplay.core.Storage`, an offline dataset
        without ``sample`` / ``len``, a ``transform`` that is not callable).

    Notes
    -----
    Differences from TorchRL:

    - **The two halves carry the same entries.** When the offline dataset is a
      :class:`~tdreplay.core.TensorDictReplayBuffer` (every dataset class is one), the online
      buffer is a ``TensorDictReplayBuffer`` too (else a plain
      :class:`~tdreplay.core.ReplayBuffer`), so both halves carry ``index``. TorchRL's online
      buffer is always a plain ``ReplayBuffer``, whose samples have no ``index``: with a
      dataset, its ``sample`` fails (``KeyError`` in ``torch.cat``) as soon as the online
      buffer holds data. Each half's ``index`` refers to its own buffer: rows
      ``[0, n_offline)`` of a batch are slots of the offline dataset, the others slots of
      :attr:`online_buffer`.
    - **Entries that still differ** (e.g. a prioritized offline sampler's
      ``priority_weight``) raise a ``KeyError`` naming the entries only one side has, before
      anything is concatenated. TensorDicts and tensors are concatenated with ``torch.cat``,
      lists by list concatenation; other samples raise ``TypeError``.
    - **Checkpoints**: :meth:`state_dict` / :meth:`load_state_dict` and :meth:`dumps` /
      :meth:`loads` save and restore the online buffer, the offline fraction (annealed and
      base) and the offline dataset's sampler state (a without-replacement epoch, priorities
      updated on dataset rows); TorchRL's class has none. The offline dataset's rows are not
      saved: they are immutable and reloaded from their source. ``dumps`` is atomic as a
      whole, and a failed load changes nothing.
    - **Argument checks** TorchRL lacks: the types of ``offline_fraction`` (a bool or a
      string is refused), of the batch sizes and of :meth:`anneal`'s steps
      (``total_steps <= 0`` or a negative ``step`` raise ``ValueError``; TorchRL divides by
      zero or returns a fraction above the base).
    - **A refused batch consumes nothing**: when the online draw, the join or ``transform``
      raises after the offline rows were drawn, the offline draw is given back (a
      without-replacement epoch keeps its rows, transforms with state their statistics;
      :func:`~tdreplay.core.buffer_draw.reads_undone_on_failure`). TorchRL's keeps the
      offline rows drawn: they are missing from the epoch.

    Thread safety: :meth:`sample` holds the locks of both buffers (the offline one first)
    while it draws; :meth:`extend` goes to the online buffer; :meth:`anneal` is one attribute
    write. A batch sampled while another thread calls
    :meth:`anneal` uses the fraction before or after it, never a mix.

    Examples
    --------
    >>> import torch
    >>> from tensordict import TensorDict
    >>> from tdreplay.core import TensorDictReplayBuffer
    >>> from tdreplay.storages import LazyTensorStorage
    >>> offline = TensorDictReplayBuffer(storage=LazyTensorStorage(100))
    >>> _ = offline.extend(TensorDict({"obs": torch.arange(100.0)}, [100]))
    >>> rb = OfflineToOnlineReplayBuffer(offline, online_capacity=50, offline_fraction=0.25,
    ...                                  batch_size=8)
    >>> bool((rb.sample()["obs"] < 100).all())  # nothing online yet: all offline
    True
    >>> rb.extend(TensorDict({"obs": torch.arange(1000.0, 1010.0)}, [10])).tolist()
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    >>> batch = rb.sample()
    >>> (batch["obs"] < 100).tolist()  # round(0.25 * 8) = 2 offline rows, then 6 online ones
    [True, True, False, False, False, False, False, False]
    >>> rb.anneal(step=50, total_steps=100)
    >>> rb.offline_fraction, len(rb)
    (0.125, 110)
    >>> rb
    OfflineToOnlineReplayBuffer(offline=TensorDictReplayBuffer, offline_fraction=0.125, \
online_size=10, batch_size=8)
    """

    def __init__(
        self,
        offline_dataset: Any,
        *,
        online_storage: Storage | None = None,
        online_capacity: int | None = None,
        offline_fraction: float = 0.5,
        batch_size: int | None = None,
        transform: Callable[[Any], Any] | None = None,
        **dataset_kwargs: Any,
    ) -> None:
        if online_storage is not None and online_capacity is not None:
            raise ValueError("Provide online_storage OR online_capacity, not both.")
        if online_storage is None and online_capacity is None:
            raise ValueError("Provide one of online_storage or online_capacity.")
        if online_capacity is not None:
            capacity = check_required_count(online_capacity, "online_capacity", 1)
        else:
            check_instance(online_storage, Storage, "online_storage")  # type: ignore[type-abstract]
        fraction = _check_fraction(offline_fraction)
        if batch_size is not None:
            batch_size = check_batch_size(batch_size)
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be callable, got {type(transform).__name__}.")

        if isinstance(offline_dataset, str):
            if batch_size is None:
                raise ValueError("batch_size must be provided when offline_dataset is a "
                                 "string, so the dataset can be constructed.")
            offline_dataset = load_dataset(offline_dataset, batch_size=batch_size,
                                           **dataset_kwargs)
        elif dataset_kwargs:
            raise ValueError(
                f"dataset_kwargs ({sorted(dataset_kwargs)}) are only forwarded when "
                "offline_dataset is a string. Pass them directly to your dataset constructor "
                "instead.")
        if not callable(getattr(offline_dataset, "sample", None)) \
                or not hasattr(offline_dataset, "__len__"):
            raise TypeError(f"offline_dataset must be a replay buffer (with sample() and len()) "
                            f"or a dataset id string, got {type(offline_dataset).__name__}.")

        if online_storage is None:
            online_storage = LazyTensorStorage(capacity)
        elif online_storage is getattr(offline_dataset, "storage", None):
            raise ValueError(
                "online_storage is the offline dataset's own storage: the online writes would "
                "overwrite the dataset's rows, and its offline draws return them. Pass a "
                "storage of its own (or online_capacity).")
        online: ReplayBuffer
        if isinstance(offline_dataset, TensorDictReplayBuffer):
            online = TensorDictReplayBuffer(storage=online_storage)
        else:
            online = ReplayBuffer(storage=online_storage)

        self._offline_buffer = offline_dataset
        self._online_buffer = online
        # the current fraction (lowered by anneal) and the one it anneals from
        self._offline_fraction = fraction
        self._base_offline_fraction = fraction
        self._batch_size = batch_size
        self._transform = transform
        # held to change or read the two fractions together (never while sampling)
        self._lock = threading.Lock()

    # ---- data --------------------------------------------------------------------------------
    def extend(self, data: Any) -> torch.Tensor:
        """Write ``data`` (a batch) to the online buffer; the indices it was written at there.

        Examples
        --------
        >>> from tdreplay.core import ListStorage, ReplayBuffer
        >>> offline = ReplayBuffer(storage=ListStorage(4))
        >>> _ = offline.extend([0, 1, 2, 3])
        >>> rb = OfflineToOnlineReplayBuffer(offline, online_storage=ListStorage(10))
        >>> rb.extend([100, 101]).tolist(), len(rb.online_buffer), len(rb.offline_buffer)
        ([0, 1], 2, 4)
        """
        return self._online_buffer.extend(data)

    def add(self, data: Any) -> Any:
        """Write one item to the online buffer; the index it was written at there (as the
        online buffer's ``add``).

        Examples
        --------
        >>> from tdreplay.core import ListStorage, ReplayBuffer
        >>> offline = ReplayBuffer(storage=ListStorage(4))
        >>> _ = offline.extend([0, 1, 2, 3])
        >>> rb = OfflineToOnlineReplayBuffer(offline, online_storage=ListStorage(10))
        >>> rb.add(100), len(rb.online_buffer)
        (0, 1)
        """
        return self._online_buffer.add(data)

    def sample(self, batch_size: int | None = None) -> Any:
        """A batch of ``batch_size`` rows: ``round(offline_fraction * batch_size)`` offline
        rows first, then online ones.

        Only one buffer is drawn from when the online buffer is empty or the offline share
        rounds to the whole batch (offline), or to nothing (online).

        Parameters
        ----------
        batch_size : int, optional
            Defaults to the ``batch_size`` given at construction (``ValueError`` when neither
            is set).

        Examples
        --------
        >>> from tdreplay.core import ListStorage, ReplayBuffer
        >>> offline = ReplayBuffer(storage=ListStorage(4))
        >>> _ = offline.extend([0, 1, 2, 3])
        >>> rb = OfflineToOnlineReplayBuffer(offline, online_storage=ListStorage(10),
        ...                                  offline_fraction=0.4)
        >>> _ = rb.extend([100, 101, 102])
        >>> [x >= 100 for x in rb.sample(5)]  # round(0.4 * 5) = 2 offline items
        [False, False, True, True, True]
        """
        if batch_size is None:
            batch_size = self._batch_size
            if batch_size is None:
                raise ValueError("batch_size must be provided either in __init__ or sample().")
        else:
            batch_size = check_batch_size(batch_size)
        # one step: a draw, the join or the transform refusing the batch leaves nothing
        # consumed (without-replacement epochs) and no statistics changed in either buffer
        # (an offline dataset that is not a tdreplay buffer is drawn from as it is)
        buffers = [self._offline_buffer] if isinstance(self._offline_buffer, ReplayBuffer) else []
        with reads_undone_on_failure(*buffers, self._online_buffer):
            n_offline = round(self._offline_fraction * batch_size)
            n_online = batch_size - n_offline
            if n_offline >= batch_size or len(self._online_buffer) == 0:
                out = self._offline_buffer.sample(batch_size)
            elif n_offline == 0:
                out = self._online_buffer.sample(batch_size)
            else:
                out = _concat(
                    _share(self._offline_buffer, n_offline,
                           f"the offline share, round({self._offline_fraction:g} * "
                           f"{batch_size}) = {n_offline} rows"),
                    _share(self._online_buffer, n_online,
                           f"the online share, {batch_size} - {n_offline} = {n_online} rows"))
            if self._transform is not None:
                out = self._transform(out)
        return out

    def anneal(self, step: float, total_steps: float) -> None:
        """Lower ``offline_fraction`` linearly from its initial value to 0 at ``total_steps``.

        The fraction becomes ``base * max(0, 1 - step / total_steps)``: the initial value at
        step 0, 0 from ``total_steps`` on. Call it once per training iteration.

        Parameters
        ----------
        step : int or float
            The current training step, ``>= 0``.
        total_steps : int or float
            The step at which the fraction reaches 0, ``> 0``.

        Examples
        --------
        >>> from tdreplay.core import ListStorage, ReplayBuffer
        >>> offline = ReplayBuffer(storage=ListStorage(4))
        >>> _ = offline.extend([0, 1, 2, 3])
        >>> rb = OfflineToOnlineReplayBuffer(offline, online_capacity=10, offline_fraction=0.8)
        >>> for step in (0, 25, 100, 150):
        ...     rb.anneal(step, 100)
        ...     print(round(rb.offline_fraction, 6))
        0.8
        0.6
        0.0
        0.0
        >>> rb.anneal(1, 0)
        Traceback (most recent call last):
        ...
        ValueError: total_steps must be > 0, got 0.
        """
        step_f = _check_real(step, "step")
        total = _check_real(total_steps, "total_steps")
        if total <= 0:
            raise ValueError(f"total_steps must be > 0, got {total_steps!r}.")
        if step_f < 0:
            raise ValueError(f"step must be >= 0, got {step!r}.")
        with self._lock:
            self._offline_fraction = self._base_offline_fraction * max(0.0, 1.0 - step_f / total)

    # ---- copies (pickle, deepcopy: a process pool, a Ray actor) ------------------------------
    def __getstate__(self) -> dict[str, Any]:
        """Everything but the lock: a copy gets a lock of its own (the two buffers pickle as
        buffers do).

        Examples
        --------
        >>> import pickle
        >>> from tdreplay.core import ListStorage, ReplayBuffer
        >>> offline = ReplayBuffer(storage=ListStorage(4))
        >>> _ = offline.extend([0, 1, 2, 3])
        >>> rb = OfflineToOnlineReplayBuffer(offline, online_storage=ListStorage(10),
        ...                                  offline_fraction=0.25)
        >>> rb.anneal(1, 2)
        >>> copy = pickle.loads(pickle.dumps(rb))
        >>> copy.offline_fraction, len(copy.offline_buffer)
        (0.125, 4)
        """
        state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # ---- properties --------------------------------------------------------------------------
    @property
    def offline_fraction(self) -> float:
        """The current offline share of a batch (after any :meth:`anneal`)."""
        return self._offline_fraction

    @property
    def offline_buffer(self) -> Any:
        """The immutable offline dataset."""
        return self._offline_buffer

    @property
    def online_buffer(self) -> ReplayBuffer:
        """The online buffer (a :class:`~tdreplay.core.TensorDictReplayBuffer` when the offline
        dataset is one, else a :class:`~tdreplay.core.ReplayBuffer`)."""
        return self._online_buffer

    def __len__(self) -> int:
        return len(self._offline_buffer) + len(self._online_buffer)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}("
            f"offline={type(self._offline_buffer).__name__}, "
            f"offline_fraction={self._offline_fraction:.3f}, "
            f"online_size={len(self._online_buffer)}, "
            f"batch_size={self._batch_size})"
        )

    # ---- state -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The online buffer's state, the offline fractions (current and base), the state
        of the offline dataset's sampler (``"offline_sampler"``; ``None`` when the dataset is
        not a replay buffer) and what identifies the offline dataset (``"offline_dataset"``:
        its ``dataset_id`` and number of rows, checked by :meth:`load_state_dict`).

        The offline dataset's rows are not part of it: they are immutable and reloaded from
        their source.

        Examples
        --------
        >>> from tdreplay.core import ListStorage, ReplayBuffer
        >>> offline = ReplayBuffer(storage=ListStorage(4))
        >>> _ = offline.extend([0, 1, 2, 3])
        >>> rb = OfflineToOnlineReplayBuffer(offline, online_storage=ListStorage(10))
        >>> _ = rb.extend([100, 101])
        >>> rb.anneal(1, 2)
        >>> state = rb.state_dict()
        >>> again = OfflineToOnlineReplayBuffer(offline, online_storage=ListStorage(10))
        >>> again.load_state_dict(state)
        >>> again.offline_fraction, again.online_buffer[:]
        (0.25, [100, 101])
        """
        with self._lock:
            fractions = (self._offline_fraction, self._base_offline_fraction)
        return {"online_buffer": self._online_buffer.state_dict(),
                "offline_fraction": fractions[0], "base_offline_fraction": fractions[1],
                "offline_sampler": offline_sampler_state(self._offline_buffer),
                "offline_dataset": offline_dataset_identity(self._offline_buffer)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`. Everything is checked first: a state that does not fit
        raises ``ValueError`` / ``TypeError`` naming the entry and changes nothing. That
        includes a state saved over another offline dataset (another ``dataset_id``, or
        another number of rows; states saved without that record are not checked for it),
        whose offline sampler's state belongs to that dataset's rows."""
        if not isinstance(state_dict, dict):
            raise TypeError(f"state_dict must be a dict, got {type(state_dict).__name__}.")
        missing = {"online_buffer", "offline_fraction", "base_offline_fraction"} - set(state_dict)
        if missing:
            raise ValueError(f"state_dict is missing {sorted(missing)}.")
        try:
            current, base = _check_fractions(state_dict["offline_fraction"],
                                             state_dict["base_offline_fraction"])
        except (TypeError, ValueError) as err:
            raise ValueError(f"state_dict: {err}") from err
        try:
            check_offline_dataset(self._offline_buffer, state_dict.get("offline_dataset"))
        except ValueError as err:
            raise ValueError(f"state_dict['offline_dataset']: {err}") from err
        offline = state_dict.get("offline_sampler")  # (None or absent: not saved)
        if offline is not None:
            try:
                check_offline_sampler_state(self._offline_buffer, offline)
            except ValueError as err:
                raise ValueError(f"state_dict['offline_sampler']: {err}") from err
        try:  # (all or nothing: checks every part before it changes any)
            self._online_buffer.load_state_dict(state_dict["online_buffer"])
        except TypeError as err:
            raise TypeError(f"state_dict['online_buffer']: {err}") from err
        except ValueError as err:
            raise ValueError(f"state_dict['online_buffer']: {err}") from err
        if offline is not None:
            load_offline_sampler_state(self._offline_buffer, offline)
        with self._lock:
            self._offline_fraction, self._base_offline_fraction = current, base

    def dumps(self, path: str | os.PathLike[str]) -> None:
        """Save the online buffer and the fractions into checkpoint directory ``path``.

        One atomic checkpoint (:func:`~tdreplay.core.checkpoint.write_checkpoint`): its snapshot
        holds ``offline_to_online.json`` (the fractions, and the offline dataset's
        ``dataset_id`` and number of rows), ``online/``, the online buffer's
        own checkpoint, and ``offline_sampler.pt``, the offline dataset's sampler state. A
        crash mid-way leaves the previous checkpoint loadable. The offline dataset's rows are
        not saved (they are immutable and reloaded from their source).

        Examples
        --------
        >>> import tempfile
        >>> from tdreplay.core import ListStorage, ReplayBuffer
        >>> offline = ReplayBuffer(storage=ListStorage(4))
        >>> _ = offline.extend([0, 1, 2, 3])
        >>> rb = OfflineToOnlineReplayBuffer(offline, online_storage=ListStorage(10))
        >>> _ = rb.extend([100, 101, 102])
        >>> rb.anneal(3, 4)
        >>> with tempfile.TemporaryDirectory() as path:
        ...     rb.dumps(path)
        ...     again = OfflineToOnlineReplayBuffer(offline, online_storage=ListStorage(10))
        ...     again.loads(path)
        >>> again.online_buffer[:], again.offline_fraction, len(again)
        ([100, 101, 102], 0.125, 7)
        """
        with write_checkpoint(path) as snapshot:
            with self._lock:
                current, base = self._offline_fraction, self._base_offline_fraction
            offline = write_offline_sampler_state(snapshot, self._offline_buffer)
            write_json(snapshot / _META, {
                "format": _FORMAT, "kind": _KIND, "offline_fraction": current,
                "base_offline_fraction": base, "offline_sampler": offline,
                "offline_dataset": offline_dataset_identity(self._offline_buffer),
                "online_buffer": type(self._online_buffer).__name__})
            self._online_buffer.dumps(snapshot / _ONLINE)

    def loads(self, path: str | os.PathLike[str]) -> None:
        """Restore a checkpoint written by :meth:`dumps`, all or nothing.

        The checkpoint is verified, its ``offline_to_online.json`` read and checked, then the
        online buffer loads (checking its own part before it changes), then the fractions are
        set. A missing, damaged or foreign checkpoint (another buffer class's, one whose
        online buffer is of another class, or one saved over another offline dataset: another
        ``dataset_id`` or number of rows) raises :class:`~tdreplay.core.CheckpointError`
        naming the file at fault, and changes nothing.
        """
        with open_checkpoint(Path(path)) as snapshot:
            meta_path, meta = _read_meta(path, snapshot)
            try:
                current, base = _check_fractions(meta.get("offline_fraction"),
                                                 meta.get("base_offline_fraction"))
            except (TypeError, ValueError) as err:
                raise CheckpointError(f"checkpoint file {str(meta_path)!r} is damaged: "
                                      f"{err}") from err
            saved_online = meta.get("online_buffer")
            if saved_online != type(self._online_buffer).__name__:
                raise CheckpointError(
                    f"checkpoint file {str(meta_path)!r}: the online buffer was saved as a "
                    f"{saved_online}, but this buffer's is a "
                    f"{type(self._online_buffer).__name__} (the offline dataset decides: a "
                    "TensorDictReplayBuffer dataset gets a TensorDictReplayBuffer).")
            try:
                check_offline_dataset(self._offline_buffer, meta.get("offline_dataset"))
            except ValueError as err:
                raise CheckpointError(f"checkpoint file {str(meta_path)!r}: {err}") from err
            offline = (read_offline_sampler_state(snapshot, self._offline_buffer)
                       if meta.get("offline_sampler") else None)  # (absent: not saved)
            self._online_buffer.loads(snapshot / _ONLINE)
        if offline is not None:
            load_offline_sampler_state(self._offline_buffer, offline)
        with self._lock:
            self._offline_fraction, self._base_offline_fraction = current, base


def prefill_replay_buffer(
    rb: _Buffer,
    dataset: Any,
    n_samples: int | None = None,
    chunk_size: int = 1000,
) -> _Buffer:
    """Copy the items of an offline dataset into a replay buffer, in storage order.

    A simpler alternative to :class:`OfflineToOnlineReplayBuffer`: one flat buffer, no
    per-batch ratio, the offline data copied. The first ``n_samples`` items of ``dataset``
    (all of them by default) are read as ``dataset[i:j]``, ``chunk_size`` at a time, and
    written with ``rb.extend``, in the order the dataset stores them: every item exactly once,
    and a trajectory stays contiguous, so a slice sampler on ``rb`` finds it whole.

    When ``n_samples`` stops inside an episode, the last item copied is marked truncated
    (``("next", "truncated")`` and ``("next", "done")``, in the copy; TensorDict items that
    carry a ``("next", "truncated")`` entry), so that the online steps written after it do not
    continue the dataset's episode for a slice sampler or ``rb.query``.

    Difference from TorchRL: TorchRL's ``prefill_replay_buffer`` calls
    ``dataset.sample(chunk)`` repeatedly, so with the usual random sampler its "copy" repeats
    some items, misses others and cuts the trajectories apart.

    Parameters
    ----------
    rb : ReplayBuffer
        The buffer to fill (anything with ``extend``); returned for chaining.
    dataset : ReplayBuffer or str
        A buffer whose items are read with ``dataset[i:j]`` (a dataset such as
        :class:`~tdreplay.datasets.MinariExperienceReplay`, or any replay buffer of
        TensorDicts, tensors or lists), or a prefixed id built with
        ``load_dataset(dataset, batch_size=chunk_size)``.
    n_samples : int, optional
        How many items to copy (at most ``len(dataset)``); ``None``: all of them. ``0`` copies
        nothing (a configuration without prefill).
    chunk_size : int
        Items read and written per step (``>= 1``); also the batch size of a dataset built from
        a string. Default ``1000``.

    Returns
    -------
    ReplayBuffer
        ``rb``.

    Raises
    ------
    TypeError
        ``n_samples`` / ``chunk_size`` not an int (bools refused), ``rb`` without ``extend``,
        ``dataset`` neither a string nor indexable with a length.
    ValueError
        ``n_samples < 0`` or ``chunk_size < 1``.

    Examples
    --------
    >>> import torch
    >>> from tensordict import TensorDict
    >>> from tdreplay.core import ReplayBuffer
    >>> from tdreplay.storages import LazyTensorStorage
    >>> dataset = ReplayBuffer(storage=LazyTensorStorage(500))
    >>> _ = dataset.extend(TensorDict({"obs": torch.arange(500)}, [500]))
    >>> online = ReplayBuffer(storage=LazyTensorStorage(10_000))
    >>> prefill_replay_buffer(online, dataset, n_samples=200, chunk_size=64) is online
    True
    >>> len(online), bool((online[:]["obs"] == torch.arange(200)).all())
    (200, True)
    """
    chunk = check_required_count(chunk_size, "chunk_size", 1)
    limit = None if n_samples is None else check_required_count(n_samples, "n_samples", 0)
    extend = getattr(rb, "extend", None)
    if not callable(extend):
        raise TypeError(f"rb must be a replay buffer (with extend()), got {type(rb).__name__}.")
    if isinstance(dataset, str):
        dataset = load_dataset(dataset, batch_size=chunk)
    elif not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
        raise TypeError(f"dataset must be a replay buffer (indexable, with len()) or a dataset "
                        f"id string, got {type(dataset).__name__}.")
    size = len(dataset)
    total = size if limit is None else min(limit, size)
    for start in range(0, total, chunk):
        items = dataset[start:min(start + chunk, total)]
        if start + chunk >= total and total < size:  # (the copy stops inside the dataset)
            items = _last_step_truncated(items)
        extend(items)
    return rb


def _last_step_truncated(items: Any) -> Any:
    """``items`` with its last item marked truncated (and done) when it is a batch of
    TensorDicts carrying ``("next", "truncated")`` and that item ends no episode (``items``
    itself unchanged: new tensors for the flags); else ``items`` as they are (a done flag alone
    would read as a termination)."""
    if not is_tensor_collection(items) or not items.batch_dims or not items.batch_size[0]:
        return items
    truncated, done = items.get(("next", "truncated"), None), items.get(("next", "done"), None)
    if not isinstance(truncated, torch.Tensor) or bool(truncated[-1].any()) \
            or isinstance(done, torch.Tensor) and bool(done[-1].any()):
        return items
    return marked_truncated(items, -1)


def _read_meta(path: str | os.PathLike[str], snapshot: Path) -> tuple[Path, dict[str, Any]]:
    """The path and contents of the ``offline_to_online.json`` of the checkpoint ``path``
    (its verified ``snapshot``); :class:`~tdreplay.core.CheckpointError` when it is missing
    (naming the buffer class whose checkpoint it is, if another's) or of another kind or
    format."""
    meta_path = snapshot / _META
    if not meta_path.is_file():
        other = snapshot / "buffer.json"
        what = ""
        if other.is_file():
            try:
                what = f" (it holds a {read_json(other).get('buffer')} checkpoint)"
            except CheckpointError:
                pass
        raise CheckpointError(
            f"{str(path)!r} is not a checkpoint of an {_KIND}: its snapshot has no "
            f"{_META} ({str(meta_path)!r} is missing){what}.")
    meta = read_json(meta_path)
    if meta.get("kind") != _KIND or meta.get("format") != _FORMAT:
        raise CheckpointError(
            f"checkpoint file {str(meta_path)!r} is not an {_KIND} checkpoint of format "
            f"{_FORMAT} (kind {meta.get('kind')!r}, format {meta.get('format')!r}).")
    return meta_path, meta
