"""``PrioritizedSliceSampler``: slices whose start steps are drawn by priority."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from tdreplay.core import Storage
from tdreplay.core.utils import NestedKey

from ._slice_output import INIT_KEY
from ._slicing import (
    REJECTION_ROUNDS,
    no_trajectory_error,
    overhang,
    ragged_arange,
    slice_shape,
    slice_slots,
)
from ._trajectory_index import LANE, LEN, START, TrajectoryIndex
from .prioritized import PRIORITY_WEIGHT_KEY, WRITE_GENERATION_KEY, PrioritizedSampler
from .slice import SliceSampler
from .without_replacement import check_replacement

__all__ = ["PrioritizedSliceSampler"]


class PrioritizedSliceSampler(SliceSampler):
    """Slices of trajectories whose first step is drawn in proportion to its priority.

    Every step has a priority (as with :class:`PrioritizedSampler`: new steps get the current
    max priority, :meth:`update_priority` sets them, typically one TD error per step of the
    sampled slices). A slice starts at a step drawn with probability ``p_i / sum_j p_j`` among
    the steps that can start a slice, and runs along its trajectory like the slices of
    :class:`SliceSampler` (never crossing a trajectory boundary, truncation marked at its
    end). A step can start a slice when at least ``slice length`` steps of its trajectory
    start there (``strict_length=True``), or when the slice fits up to the trajectory's end
    or is the trajectory's first step (``strict_length=False``, shorter slices). As in
    TorchRL, a high-priority step too close to the end of its trajectory is reached only by
    slices starting earlier.

    ``info["priority_weight"]`` holds the importance weight ``(p_start / p_min) ** -beta`` of
    each slice's start, repeated over the slice's steps (``p_min`` over every stored step);
    ``info["write_generation"]`` the write generation of every sampled step (see
    :class:`PrioritizedSampler`).

    Drawing: start steps are drawn from the priority tree and redrawn while they cannot start
    a slice (exact rejection sampling, ``O(batch)`` as long as most of the priority mass can
    start a slice). When that keeps failing, the steps that cannot start a slice are masked in
    the tree for one draw (TorchRL's method, ``O(trajectories * slice length)``).

    The priorities are kept by a :class:`PrioritizedSampler` of the steps (:attr:`priorities`)
    that draws the candidate starts; this sampler forwards its priority API to it.

    Parameters
    ----------
    max_capacity, alpha, beta, eps, dtype, reduction, max_priority_within_buffer
        As :class:`PrioritizedSampler`.
    num_slices, slice_len, end_key, end_keys, traj_key, trajectory_key, ends, trajectories,
    cache_values, truncated_key, init_key, strict_length, compile, use_gpu
        As :class:`SliceSampler` (``fragmented`` and ``step_key`` are not accepted: a
        ``TypeError``, as in TorchRL).
    span : bool, int or (bool | int, bool | int)
        Only the right side is used: slices may hang over the end of their trajectory
        (``True``: any step can start a slice; ``i``: by at most ``i`` steps) and are cut
        there (with ``strict_length=True`` too: a buffer shorter than a slice is sampled when
        the span allows cutting the slices, as in TorchRL). A start is a stored step, so there
        is nothing to hang over on the left: a left span (e.g. ``span=3`` or ``True``) is
        turned off with a ``UserWarning``, as in TorchRL. An int right span must be smaller
        than the slice length (``ValueError`` at sampling, as :class:`SliceSampler`): there
        TorchRL draws starts only from the first steps of the longest trajectories, or none.
    device, backend, skip_stale_updates, validate
        As :class:`PrioritizedSampler`. The trajectory bookkeeping stays on the CPU, so with
        device trees every batch copies its candidate start steps to the host.
    replacement : bool
        TorchRL's ``replacement=``: there is no prioritized slice sampler without replacement,
        so ``False`` raises a ``TypeError`` (as in TorchRL).

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> from tdreplay.core import TensorDictReplayBuffer
    >>> from tdreplay.storages import LazyTensorStorage
    >>> sampler = PrioritizedSliceSampler(100, alpha=1.0, beta=1.0, slice_len=4,
    ...                                   traj_key="episode")
    >>> rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), sampler=sampler)
    >>> _ = rb.extend(TensorDict({"episode": torch.arange(4).repeat_interleave(10)}, [40]))
    >>> priority = torch.full((40,), 1e-6)
    >>> priority[12] = 1.0                                    # step 2 of episode 1
    >>> rb.update_priority(torch.arange(40), priority)
    >>> s = rb.sample(8)
    >>> s["index"].view(2, 4).tolist()
    [[12, 13, 14, 15], [12, 13, 14, 15]]
    >>> s["priority_weight"].shape, bool(s["next", "truncated"].view(2, 4)[:, -1].all())
    (torch.Size([8]), True)
    """

    _tracks_slots = True
    is_prioritized = True
    shareable = False  # the PrioritizedSampler of the steps keeps its trees in one process
    info_keys = (PRIORITY_WEIGHT_KEY, WRITE_GENERATION_KEY)
    update_keys = (WRITE_GENERATION_KEY,)

    def __init__(
        self,
        max_capacity: int,
        alpha: float,
        beta: float,
        eps: float = 1e-8,
        dtype: torch.dtype = torch.float,
        reduction: str = "max",
        *,
        num_slices: int | None = None,
        slice_len: int | None = None,
        end_key: NestedKey | None = None,
        traj_key: NestedKey | None = None,
        trajectory_key: NestedKey | None = None,
        ends: torch.Tensor | None = None,
        trajectories: torch.Tensor | None = None,
        cache_values: bool = False,
        truncated_key: NestedKey | None = ("next", "truncated"),
        init_key: NestedKey | None = INIT_KEY,
        strict_length: bool = True,
        compile: bool | dict = False,
        span: bool | int | tuple[bool | int, bool | int] = False,
        use_gpu: bool | torch.device = False,
        max_priority_within_buffer: bool = False,
        device: str | torch.device | None = None,
        backend: str | None = None,
        skip_stale_updates: bool = True,
        validate: bool | None = None,
        replacement: bool = True,
        end_keys: Sequence[NestedKey] | None = None,
    ) -> None:
        check_replacement(replacement, type(self).__name__, variant=False)
        self._priorities = PrioritizedSampler(
            max_capacity, alpha, beta, eps=eps, dtype=dtype, reduction=reduction,
            max_priority_within_buffer=max_priority_within_buffer, device=device,
            backend=backend, skip_stale_updates=skip_stale_updates, validate=validate)
        super().__init__(
            num_slices=num_slices, slice_len=slice_len, end_key=end_key,
            traj_key=traj_key, trajectory_key=trajectory_key, ends=ends,
            trajectories=trajectories, cache_values=cache_values, truncated_key=truncated_key,
            init_key=init_key, strict_length=strict_length, compile=compile, span=span,
            use_gpu=use_gpu, end_keys=end_keys)
        if self.span[0]:  # as TorchRL: a warning, and the left span is turned off
            warnings.warn(f"{type(self).__name__} has no left span (a start is a stored step, "
                          f"nothing hangs over on its left): span={span!r} is taken as "
                          f"span=(False, {self.span[1]!r}).", UserWarning, stacklevel=2)
            self.span = (False, self.span[1])

    # ---- priorities (forwarded to the step sampler) -------------------------------------------
    @property
    def priorities(self) -> PrioritizedSampler:
        """The :class:`PrioritizedSampler` of the steps, which draws the candidate starts."""
        return self._priorities

    @property
    def max_capacity(self) -> int:
        """Number of steps the priorities cover."""
        return self._priorities.max_capacity

    @property
    def max_size(self) -> int:
        """TorchRL's name of :attr:`max_capacity`."""
        return self._priorities.max_size

    @property
    def dtype(self) -> torch.dtype:
        """Dtype of the returned weights; see :attr:`PrioritizedSampler.dtype`."""
        return self._priorities.dtype

    @property
    def default_priority(self) -> float:
        """Priority new steps get; see :attr:`PrioritizedSampler.default_priority`.

        Examples
        --------
        >>> s = PrioritizedSliceSampler(6, alpha=0.7, beta=0.5, slice_len=2)
        >>> s.default_priority, s.max_size, s.dtype
        (1.0, 6, torch.float32)
        """
        return self._priorities.default_priority

    @property
    def alpha(self) -> Any:  # a float, or a tensor when one was given
        """Priority exponent (settable); see :class:`PrioritizedSampler`."""
        return self._priorities.alpha

    @alpha.setter
    def alpha(self, value: float | torch.Tensor) -> None:
        self._priorities.alpha = value

    @property
    def beta(self) -> Any:  # a float, or a tensor when one was given
        """Importance-sampling exponent (settable); see :class:`PrioritizedSampler`."""
        return self._priorities.beta

    @beta.setter
    def beta(self, value: float | torch.Tensor) -> None:
        self._priorities.beta = value

    @property
    def eps(self) -> float:
        """Added to every priority before the exponent."""
        return self._priorities.eps

    @property
    def reduction(self) -> str:
        """How multi-dimensional priorities are reduced to one per step."""
        return self._priorities.reduction

    @property
    def device(self) -> torch.device | None:
        """Device of the priority trees (``None`` until they exist)."""
        return self._priorities.device

    @property
    def backend(self) -> str | None:
        """Backend of the priority trees (``None`` until they exist)."""
        return self._priorities.backend

    @property
    def validate(self) -> bool:
        """Whether :meth:`update_priority` checks its inputs on the host and raises."""
        return self._priorities.validate

    @property
    def max_priority(self) -> float:
        """Priority new steps get; see :attr:`PrioritizedSampler.max_priority`."""
        return self._priorities.max_priority

    @property
    def total_priority(self) -> float:
        """Sum of the stored step priorities; see :attr:`PrioritizedSampler.total_priority`."""
        return self._priorities.total_priority

    @property
    def min_priority(self) -> float:
        """Least stored step priority; see :attr:`PrioritizedSampler.min_priority`."""
        return self._priorities.min_priority

    def set_rng(self, generator: torch.Generator | None) -> None:
        """Use ``generator`` for every draw: trajectories, starts and priorities."""
        super().set_rng(generator)
        self._priorities.set_rng(generator)

    def place_for(self, storage: Storage) -> None:
        """Settle the priority trees where ``storage`` lives (or on ``device``)."""
        self._priorities.place_for(storage)

    def update_priority(self, index: Any, priority: Any, *, storage: Storage | None = None,
                        write_generation: Any = None) -> None:
        """Set the priorities of the steps ``index``; see
        :meth:`PrioritizedSampler.update_priority`."""
        self._priorities.update_priority(index, priority, storage=storage,
                                         write_generation=write_generation)

    def check_priority(self, priority: Any) -> Any:
        """Raise as :meth:`update_priority` would on these values; see
        :meth:`PrioritizedSampler.check_priority`."""
        return self._priorities.check_priority(priority)

    def slot_generation(self, slots: Any) -> torch.Tensor:
        """Current write generation of ``slots`` (``0``: never written)."""
        return self._priorities.slot_generation(slots)

    # ---- writes ------------------------------------------------------------------------------
    def extend(self, index: torch.Tensor) -> None:
        self._priorities.extend(index)
        self._index.note_write(index)

    def mark_update(self, index: torch.Tensor, *, storage: Storage | None = None) -> None:
        """``rb.mark_update(index)``: the steps get the max priority (TorchRL's
        ``mark_update``); the trajectories are found again at the next batch."""
        self._priorities.extend(index)
        self._rewritten()

    def mark_rewritten(self, index: torch.Tensor) -> None:
        """Steps rewritten by ``rb[i] = ...`` keep their priority (as TorchRL's) and get a new
        write generation (see :meth:`PrioritizedSampler.mark_rewritten`); the trajectories are
        found again at the next batch."""
        self._priorities.mark_rewritten(index)
        self._rewritten()

    def empty(self) -> None:
        self._priorities.empty()
        super().empty()

    # ---- sampling ----------------------------------------------------------------------------
    def _strict_steps(self, seq_len: int) -> int:
        """Steps a trajectory needs to hold a ``strict_length`` slice: those before the slice
        may hang over its end (the right ``span``), so a buffer shorter than a slice is
        sampled when the span allows cutting it (as TorchRL's)."""
        return int(self._min_steps(np.array([seq_len]), seq_len)[0])

    def _min_steps(self, lengths: np.ndarray, seq_len: int) -> np.ndarray:
        """Steps that must follow (and include) a start in a trajectory of ``lengths`` steps.

        ``0`` marks a trajectory that cannot start any slice (too short, ``strict_length``).
        With ``strict_length`` and a right span, a trajectory shorter than a slice is sampled
        when it has the steps a slice needs before it may hang over (as TorchRL).
        """
        seq = np.full_like(lengths, seq_len) if self.strict_length \
            else np.minimum(lengths, seq_len)
        need = seq - overhang(self.span[1], seq)  # (at least one step)
        return np.where(lengths >= need, need, 0)

    def _room(self, index: TrajectoryIndex, starts: np.ndarray, seq_len: int
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """For start slots: whether they can start a slice, their lanes and positions, and how
        many steps follow them."""
        rec = index.rec[index.slot_rec[starts]]
        pos = index.positions_of(starts)
        remaining = rec[:, START] + rec[:, LEN] - pos
        need = self._min_steps(rec[:, LEN], seq_len)
        return (need > 0) & (remaining >= need), rec[:, LANE], pos, remaining

    def _masked_starts(self, index: TrajectoryIndex, seq_len: int) -> torch.Tensor:
        """Slots of every step that cannot start a slice (the tail of each trajectory)."""
        live = index.live_records()
        rec = index.rec[live]
        lengths = rec[:, LEN]
        need = self._min_steps(lengths, seq_len)
        tail = np.where(need > 0, need - 1, lengths)
        owner, offset = ragged_arange(tail)
        pos = rec[owner, START] + lengths[owner] - tail[owner] + offset
        return torch.from_numpy(index.slots_of(rec[owner, LANE], pos))

    def _draw(self, storage: Storage, n: int) -> tuple[np.ndarray, torch.Tensor]:
        slots, info = self._priorities.sample(storage, n)
        return slots.cpu().numpy(), info[PRIORITY_WEIGHT_KEY].cpu()

    def _draw_starts(self, storage: Storage, index: TrajectoryIndex, k: int, seq_len: int
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, torch.Tensor]:
        """``k`` starts drawn by priority among valid starts: lanes, positions, room, weights."""
        parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, torch.Tensor]] = []

        def draw(n: int, limit: int) -> int:
            """Draw ``n`` steps, keep the first ``limit`` that can start a slice."""
            cand, w = self._draw(storage, n)
            ok, lanes, pos, room = self._room(index, cand, seq_len)
            keep = np.flatnonzero(ok)[:limit]
            parts.append((lanes[keep], pos[keep], room[keep], w[torch.from_numpy(keep)]))
            return keep.size

        need = k
        for _ in range(REJECTION_ROUNDS):
            need -= draw(need + need // 2 + 8, need)
            if need == 0:
                break
        else:
            # most of the priority mass sits on steps that cannot start a slice: mask them
            lengths = index.rec[index.live_records(), LEN]
            if not (self._min_steps(lengths, seq_len) > 0).any():
                raise no_trajectory_error(index, seq_len)
            with self._priorities.excluded(self._masked_starts(index, seq_len)):
                while need:
                    need -= draw(need, need)
        lanes, pos, room, weights = zip(*parts)
        return np.concatenate(lanes), np.concatenate(pos), np.concatenate(room), torch.cat(weights)

    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict[str, Any]]:
        num_slices, seq_len = slice_shape(batch_size, self.num_slices, self.slice_len)
        self._check_sampleable(storage, seq_len)
        self._priorities.place_for(storage)
        index = self._sync(storage)
        if index.num_trajectories == 0:
            raise RuntimeError("the buffer holds no trajectory to sample from.")
        lanes, first, room, weights = self._draw_starts(storage, index, num_slices, seq_len)
        slots, ends, owner = slice_slots(index, lanes, first, np.minimum(room, seq_len), seq_len)
        slots, info = self._output(storage, slots, ends)
        # (repeat_interleave with a tensor of repeats costs milliseconds on CPU)
        info[PRIORITY_WEIGHT_KEY] = weights.repeat_interleave(seq_len) if owner is None \
            else weights[torch.from_numpy(owner)]
        info[WRITE_GENERATION_KEY] = self.slot_generation(slots)
        return slots, info

    # ---- state -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {**self._priorities.state_dict(), "index": self._index_state()}

    def check_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not isinstance(state_dict, dict) or "index" not in state_dict:
            raise ValueError(f"{type(self).__name__} state_dict must hold the priorities and an "
                             "'index' entry.")
        self._priorities.check_state_dict(
            {k: v for k, v in state_dict.items() if k != "index"})
        TrajectoryIndex.check_state_dict(state_dict["index"])

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not isinstance(state_dict, dict) or "index" not in state_dict:
            raise ValueError(f"{type(self).__name__} state_dict must hold the priorities and an "
                             "'index' entry.")
        TrajectoryIndex.check_state_dict(state_dict["index"])
        # checks the priorities, then loads them: nothing changes if they are refused
        self._priorities.load_state_dict({k: v for k, v in state_dict.items() if k != "index"})
        self._load_index(state_dict["index"])

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(max_capacity={self.max_capacity}, alpha={self.alpha}, "
                f"beta={self.beta}, {self._repr_args()}, span={self.span})")
