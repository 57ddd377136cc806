"""``VecNorm``: standardise entries with running (decayed) statistics of the data seen."""

from __future__ import annotations

import copy
import threading
import warnings
from collections.abc import Sequence
from contextlib import AbstractContextManager
from multiprocessing.synchronize import SemLock
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from tdreplay.core import Compose, Transform
from tdreplay.core.process_sharing import sending_to_new_process
from tdreplay.core.transform import NestedKey
from tdreplay.core.utils import check_flag, restore_attributes

from ._state import checked_state
from ._utils import keys_arg, require_tensordict
from .normalization import ObservationNorm

_SUFFIXES = ("_sum", "_ssq", "_count")


def _stat_key(key: NestedKey, suffix: str) -> NestedKey:
    """``"obs"`` -> ``"obs_sum"``; ``("a", "b")`` -> ``("a", "b_sum")``."""
    return key + suffix if isinstance(key, str) else (*key[:-1], key[-1] + suffix)


def _flat_name(key: NestedKey) -> str:
    return key if isinstance(key, str) else ".".join(key)


def _check_key_stats(key: NestedKey, state: dict[str, torch.Tensor]) -> None:
    """``ValueError`` naming the entry unless the saved statistics of ``key`` are usable: all
    three or none, finite floating tensors, ``_sum`` and ``_ssq`` of one shape, a one-element
    ``_count`` >= 0 (what :meth:`VecNorm.forward` makes)."""
    names = [_flat_name(_stat_key(key, s)) for s in _SUFFIXES]
    present = [name for name in names if name in state]
    if not present:
        return
    if len(present) != len(names):
        raise ValueError(f"VecNorm.load_state_dict: the statistics of {key!r} are {names}, "
                         f"state_dict holds only {present}.")
    total, ssq, count = (state[name] for name in names)
    for name, value in zip(names, (total, ssq, count)):
        if not value.is_floating_point() or not bool(torch.isfinite(value).all()):
            raise ValueError(f"VecNorm.load_state_dict: state_dict[{name!r}] must be finite "
                             f"floating-point values, got {value.dtype} {value.flatten()[:4]}.")
    if total.shape != ssq.shape:
        raise ValueError(f"VecNorm.load_state_dict: state_dict[{names[0]!r}] has shape "
                         f"{tuple(total.shape)} but state_dict[{names[1]!r}] has "
                         f"{tuple(ssq.shape)}.")
    if count.numel() != 1 or bool(count.min() < 0):
        raise ValueError(f"VecNorm.load_state_dict: state_dict[{names[2]!r}] must be one "
                         f"count >= 0, got {count.flatten()[:4].tolist()}.")


def _sum_left(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``value`` summed over its leading dims until it has the dims of ``like``."""
    while value.ndim > like.ndim:
        value = value.sum(0)
    return value


def stats_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the running statistics of data of ``dtype`` are kept in: float32 or wider.

    A float16 sum of squares overflows on ordinary data (float16 ends at 65504: 700 values
    of 10), a bfloat16 sum stops growing (8 bits of mantissa); float64 data keeps float64.

    Examples
    --------
    >>> stats_dtype(torch.float16), stats_dtype(torch.bfloat16), stats_dtype(torch.float64)
    (torch.float32, torch.float32, torch.float64)
    """
    return torch.promote_types(dtype, torch.float32)


def _mean_std(total: torch.Tensor, ssq: torch.Tensor, count: torch.Tensor, eps: float
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean and standard deviation (at least ``sqrt(eps)``) of running statistics."""
    mean = total / count
    return mean, (ssq / count - mean.pow(2)).clamp_min(eps).sqrt()


def _widened(value: torch.Tensor, stat: torch.Tensor) -> torch.Tensor:
    """``value`` in the wider of its dtype and that of ``stat``: sums and results are computed
    there (torch would compute ``value - stat`` in ``value``'s dtype for a 0-dim ``stat``)."""
    return value.to(torch.promote_types(value.dtype, stat.dtype))


def _as_input_dtype(result: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """``result`` (computed in the statistics' dtype) in the dtype of the floating ``value``
    it was computed from; other inputs (integers) get the statistics' dtype."""
    return result.to(value.dtype) if value.is_floating_point() else result


_Stats = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # sum, sum of squares, count


def _check_shared_stats(shared_td: TensorDictBase, in_keys: Sequence[NestedKey]) -> None:
    """``KeyError`` unless ``shared_td`` holds the three statistics of every in_key,
    ``ValueError`` (naming the entry) for sums in a dtype narrower than :func:`stats_dtype`
    (float16 / bfloat16, integers), where running sums overflow or stop growing."""
    present = set(shared_td.keys(True, True))
    for key in in_keys:
        absent = [k for k in (_stat_key(key, s) for s in _SUFFIXES) if k not in present]
        if absent:
            raise KeyError(f"VecNorm: shared_td lacks {absent} for in_key {key!r}.")
        for name in (_stat_key(key, "_sum"), _stat_key(key, "_ssq")):
            dtype = shared_td.get(name).dtype
            if stats_dtype(dtype) != dtype:
                raise ValueError(f"VecNorm: shared_td[{name!r}] is {dtype}, where running sums "
                                 f"overflow or stop growing: make it {stats_dtype(dtype)}.")


class VecNorm(Transform):
    """Standardises entries on sample with running statistics, updated by every sample seen.

    For each entry it keeps a decayed sum, sum of squares and count (per feature), updates them
    with the batch (unless frozen), then returns ``(x - mean) / std`` with
    ``std = sqrt(max(ssq / count - mean ** 2, eps))``, as TorchRL's ``VecNorm``. Nothing happens
    on extend. The statistics are the transform's state (:meth:`state_dict`, keys
    ``"<key>_sum"``, ``"<key>_ssq"``, ``"<key>_count"``, nested keys joined with ``"."``);
    updates hold ``lock``, so a prefetching buffer may run it from its worker thread.

    The statistics are kept in float32 or wider (:func:`stats_dtype`): those of float16 or
    bfloat16 data in float32, where TorchRL keeps them in the data's dtype and a float16 sum
    of squares overflows to ``inf``; the outputs keep the dtype of the input. A batch that
    would make the statistics non-finite (it holds ``nan`` / ``inf``, or values whose squares
    overflow) is refused with a ``ValueError`` naming the entry, the statistics unchanged, so
    :meth:`state_dict` always holds statistics :meth:`load_state_dict` accepts.

    It pickles and deep-copies (a buffer holding it does): the copy gets a new lock, except
    that a multiprocessing lock goes along to a process being started (spawn, forkserver),
    where statistics in shared memory (``shared_td``) stay shared as well.

    Parameters
    ----------
    in_keys, out_keys : sequence of nested keys
        Entries normalised (an absent one is skipped; a ``UserWarning``, once, when a call
        finds none of them). Defaults to ``["observation",
        "reward"]``; ``out_keys`` defaults to ``in_keys``.
    shared_td : TensorDict, optional
        Statistics to use and update in place (in shared memory or memory-mapped), holding
        ``"<key>_sum"``, ``"<key>_ssq"`` and ``"<key>_count"`` for every in_key, the sums in
        float32 or wider.
    lock : context manager, optional
        Held while the statistics change; a new ``threading.Lock`` by default (give a
        ``multiprocessing`` lock with statistics shared between processes).
    decay : float
        Decay of the running sums, in ``(0, 1]``. Defaults to ``0.9999``.
    eps : float
        Lower bound of the variance and of the standard deviation. Defaults to ``1e-4``.
    shapes : list of torch.Size, optional
        Shape of the statistics of each in_key (the trailing dims of the entry); defaults to
        the entry's shape past the batch dims.

    Examples
    --------
    >>> import torch
    >>> from tensordict import TensorDict
    >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
    <torch._C.Generator object at ...>
    >>> t = VecNorm(in_keys=["obs"], decay=1.0)
    >>> out = t(TensorDict({"obs": torch.randn(1000, 3) * 4 + 2}, [1000]))["obs"]
    >>> bool(out.mean(0).abs().max() < 1e-3), bool((out.std(0) - 1).abs().max() < 1e-2)
    (True, True)
    >>> sorted(t.state_dict())
    ['obs_count', 'obs_ssq', 'obs_sum']
    """

    #: whether a call found none of the in_keys in its data and warned (said once)
    _warned_absent: bool = False

    def __init__(
        self,
        in_keys: Sequence[NestedKey] | NestedKey | None = None,
        out_keys: Sequence[NestedKey] | NestedKey | None = None,
        shared_td: TensorDictBase | None = None,
        lock: AbstractContextManager[Any] | None = None,
        decay: float = 0.9999,
        eps: float = 1e-4,
        shapes: Sequence[torch.Size | Sequence[int]] | None = None,
        new_api: bool | None = None,
    ) -> None:
        if check_flag(new_api, "VecNorm: new_api", allow_none=True):
            raise NotImplementedError("VecNorm(new_api=True) asks for TorchRL's VecNormV2, "
                                      "which tdreplay does not have.")
        in_keys = ["observation", "reward"] if in_keys is None else in_keys
        super().__init__(keys_arg(in_keys, "in_keys"),
                         None if out_keys is None else keys_arg(out_keys, "out_keys"))
        for name, value, low in (("decay", decay, 0.0), ("eps", eps, 0.0)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < low:
                raise ValueError(f"VecNorm: {name} must be a non-negative number, got {value!r}.")
        if not 0 < decay <= 1:
            raise ValueError(f"VecNorm: decay must be in (0, 1], got {decay!r}.")
        if shapes is not None and len(shapes) != len(self.in_keys):
            raise ValueError(f"VecNorm: shapes has {len(shapes)} entries for "
                             f"{len(self.in_keys)} in_keys.")
        if shared_td is not None:
            if not isinstance(shared_td, TensorDictBase):
                raise TypeError(f"VecNorm: shared_td must be a TensorDict, got "
                                f"{type(shared_td).__name__}.")
            if not (shared_td.is_shared() or shared_td.is_memmap()):
                raise RuntimeError("VecNorm: shared_td must be in shared memory or memory-mapped.")
            _check_shared_stats(shared_td, self.in_keys)
        self.stats: TensorDictBase | None = shared_td
        self.lock: AbstractContextManager[Any] = threading.Lock() if lock is None else lock
        self.decay = float(decay)
        self.eps = float(eps)
        self.shapes = None if shapes is None else [torch.Size(s) for s in shapes]
        self.frozen = False

    # ---- freezing ------------------------------------------------------------------------------
    def freeze(self) -> VecNorm:
        """Stop updating the statistics (they are still used); returns ``self``."""
        self.frozen = True
        return self

    def unfreeze(self) -> VecNorm:
        """Update the statistics again; returns ``self``."""
        self.frozen = False
        return self

    def frozen_copy(self) -> VecNorm:
        """A frozen copy with a copy of the current statistics (not updated by ``self``)."""
        if self.stats is None:
            raise RuntimeError("VecNorm has seen no data yet: nothing to copy.")
        clone = copy.copy(self)  # with a new lock (__getstate__)
        clone.stats = self.stats.clone()
        return clone.freeze()

    # ---- statistics ----------------------------------------------------------------------------
    def _held(self, key: NestedKey) -> _Stats | None:
        """The statistics of ``key`` (``None`` before it was seen)."""
        if self.stats is None or _stat_key(key, "_sum") not in self.stats.keys(True, True):
            return None
        total, ssq, count = (self.stats.get(_stat_key(key, s)) for s in _SUFFIXES)
        return total, ssq, count

    def _fresh(self, key: NestedKey, value: torch.Tensor, data: TensorDictBase) -> _Stats:
        """Zero statistics for ``key``, shaped as its entry past the batch dims (or ``shapes``),
        in :func:`stats_dtype` of its dtype."""
        if self.shapes is None:
            shape = value.shape[data.batch_dims:]
        else:
            shape = self.shapes[self.in_keys.index(key)]
        zeros = torch.zeros(shape, dtype=stats_dtype(value.dtype), device=value.device)
        return zeros, zeros.clone(), torch.zeros(1, device=value.device)

    def _accumulated(self, key: NestedKey, value: torch.Tensor, n: int, stats: _Stats
                     ) -> _Stats:
        """``stats`` updated with ``value`` (``n`` items), as new tensors; ``ValueError``
        naming ``key`` when they would not be finite."""
        total, ssq, count = stats
        if value.ndim < total.ndim or value.shape[value.ndim - total.ndim:] != total.shape:
            raise ValueError(f"VecNorm: the batch's {key!r} has items of shape "
                             f"{tuple(value.shape[value.ndim - total.ndim:])}, its running "
                             f"statistics {tuple(total.shape)}: refused, the statistics are "
                             "unchanged.")
        wide = _widened(value, total)
        total = (total * self.decay + _sum_left(wide, total)).to(total.dtype)
        ssq = (ssq * self.decay + _sum_left(wide.pow(2), ssq)).to(ssq.dtype)
        if not bool(torch.isfinite(total).all() & torch.isfinite(ssq).all()):
            raise ValueError(f"VecNorm: the batch's {key!r} would make its running statistics "
                             f"non-finite (it holds nan / inf, or values whose squares overflow "
                             f"{total.dtype}); refused, the statistics are unchanged.")
        return total, ssq, count * self.decay + n

    def _store(self, key: NestedKey, stats: _Stats) -> None:
        """Make ``stats`` those of ``key``: written into the held tensors (shared statistics
        stay shared), set for a key seen for the first time."""
        if self.stats is None:
            self.stats = TensorDict()
        for suffix, value in zip(_SUFFIXES, stats):
            name = _stat_key(key, suffix)
            held = self.stats.get(name, None)
            if held is None:
                self.stats.set(name, value)
            elif held is not value:
                held.copy_(value)

    def forward(self, data: TensorDictBase) -> TensorDictBase:
        require_tensordict(self, data)
        present = {key: (out_key, value) for key, out_key in zip(self.in_keys, self.out_keys)
                   if (value := data.get(key, None)) is not None}
        if not present and not self._warned_absent:
            self._warned_absent = True
            warnings.warn(f"VecNorm: none of its in_keys {self.in_keys} is in the data (its "
                          f"entries: {sorted(map(str, data.keys(True, True)))[:8]}): nothing "
                          "was normalised. Check in_keys (an absent entry is skipped, as by "
                          "TorchRL's VecNorm; this is said once).", UserWarning, stacklevel=2)
        n = max(1, data.numel())
        with self.lock:
            stats = {key: self._held(key) or self._fresh(key, value, data)
                     for key, (_, value) in present.items()}
            if not self.frozen:  # every entry checked before any statistic changes
                stats = {key: self._accumulated(key, value, n, stats[key])
                         for key, (_, value) in present.items()}
            for key, (out_key, value) in present.items():
                self._store(key, stats[key])
                mean, std = _mean_std(*stats[key], self.eps)
                normalised = (_widened(value, mean) - mean) / std.clamp_min(self.eps)
                data.set(out_key, _as_input_dtype(normalised, value))
        return data

    def _loc_scale(self, key: NestedKey) -> tuple[torch.Tensor, torch.Tensor]:
        stats = self._held(key)
        if stats is None:
            raise RuntimeError(f"VecNorm has no statistics for {key!r} yet: it has seen no "
                               "data with that entry.")
        return _mean_std(*stats, self.eps)

    @property
    def standard_normal(self) -> bool:
        """Always ``True``: ``loc`` and ``scale`` standardise (``(x - loc) / scale``)."""
        return True

    @property
    def loc(self) -> TensorDict:
        """The current means, one entry per in_key."""
        return TensorDict({key: self._loc_scale(key)[0] for key in self.in_keys})

    @property
    def scale(self) -> TensorDict:
        """The current standard deviations, one entry per in_key."""
        return TensorDict({key: self._loc_scale(key)[1] for key in self.in_keys})

    def denorm(self, data: TensorDictBase) -> TensorDictBase:
        """A shallow copy of ``data`` with each out_key mapped back (``x * scale + loc``) into
        its in_key."""
        data = require_tensordict(self, data).copy()
        for key, out_key in zip(self.in_keys, self.out_keys):
            value = data.get(out_key, None)
            if value is not None:
                loc, scale = self._loc_scale(key)
                data.set(key, _as_input_dtype(_widened(value, scale) * scale + loc, value))
        return data

    def to_observation_norm(self) -> ObservationNorm | Compose:
        """Static :class:`ObservationNorm` transforms (one per key) with the current stats."""
        norms = [ObservationNorm(*self._loc_scale(key), in_keys=[key], out_keys=[out_key],
                                 standard_normal=True)
                 for key, out_key in zip(self.in_keys, self.out_keys)]
        return norms[0] if len(norms) == 1 else Compose(*norms)

    # ---- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, torch.Tensor]:
        """The running statistics (empty before any data was seen)."""
        if self.stats is None:
            return {}
        return {_flat_name(k): torch.as_tensor(v).clone()
                for k, v in self.stats.items(True, True)}

    #: the running statistics are saved with the buffer's ``state_dict`` / ``dumps``
    has_state = True

    def check_state_dict(self, state_dict: Any) -> None:
        """Refuse (``TypeError`` / ``KeyError`` naming the field) a state that is not tensors
        of statistics of ``in_keys``, and (``ValueError``) statistics that cannot be used (a
        key's three not all there, not finite floats, ``_sum`` / ``_ssq`` shapes that differ,
        a ``_count`` that is not one value >= 0); changes nothing."""
        self._checked(state_dict)

    def _checked(self, state_dict: Any) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        names = [str(name) for name in state_dict] if isinstance(state_dict, dict) else []
        state = checked_state(self, state_dict, names)
        keys = {_flat_name(_stat_key(k, s)): _stat_key(k, s) for k in self.in_keys
                for s in _SUFFIXES}
        unknown = sorted(set(state) - set(keys))
        if unknown:
            raise KeyError(f"VecNorm.load_state_dict: {unknown} are not statistics of in_keys "
                           f"{self.in_keys}.")
        for key in self.in_keys:
            _check_key_stats(key, state)
        return state, keys

    def load_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Restore what :meth:`state_dict` returned; shared statistics are updated in place."""
        state, keys = self._checked(state_dict)
        # (statistics saved in float16 / bfloat16 go on in float32)
        loaded = TensorDict({keys[name]: value.to(stats_dtype(value.dtype), copy=True)
                             for name, value in state.items()})
        with self.lock:
            if self.stats is not None and (self.stats.is_shared() or self.stats.is_memmap()):
                self.stats.update_(loaded)
            else:
                self.stats = loaded

    # ---- copies --------------------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        """Pickle (and deep-copy) without the lock, which does not pickle: the copy makes a
        new one. A multiprocessing lock goes along to a process being started, where it is the
        same lock, guarding statistics that stay shared there."""
        state = self.__dict__.copy()
        if not (isinstance(self.lock, SemLock) and sending_to_new_process()):
            state["lock"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        restore_attributes(self, state)
        if self.lock is None:
            self.lock = threading.Lock()

    def __repr__(self) -> str:
        return (f"VecNorm(keys={self.in_keys}, decay={self.decay}, eps={self.eps}, "
                f"frozen={self.frozen})")
