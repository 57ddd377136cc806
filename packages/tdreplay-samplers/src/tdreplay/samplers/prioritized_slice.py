"""``PrioritizedSliceSampler``: slices whose start steps are drawn by priority."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from tdreplay.core import Storage

from ._trajectory_index import LANE, LEN, START, TrajectoryIndex
from .prioritized import PRIORITY_WEIGHT_KEY, WRITE_GENERATION_KEY, PrioritizedSampler
from .slice import _REJECTION_ROUNDS, SliceSampler, _ragged_arange, _slice_slots

__all__ = ["PrioritizedSliceSampler"]


class PrioritizedSliceSampler(SliceSampler, PrioritizedSampler):
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

    Parameters
    ----------
    max_capacity, alpha, beta, eps, dtype, reduction, max_priority_within_buffer
        As :class:`PrioritizedSampler`.
    num_slices, slice_len, end_key, traj_key, trajectory_key, ends, trajectories, cache_values,
    truncated_key, strict_length, compile, use_gpu
        As :class:`SliceSampler`.
    span : bool, int or (False, bool | int)
        Only the right side is supported: slices may hang over the end of their trajectory
        (``True``: any step can start a slice; ``i``: by at most ``i`` steps) and are cut
        there. A start is a stored step, so there is nothing to hang over on the left.
    device, backend, skip_stale_updates, validate
        As :class:`PrioritizedSampler`. The trajectory bookkeeping stays on the CPU, so with
        device trees every batch copies its candidate start steps to the host.

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
        end_key: Any = None,
        traj_key: Any = None,
        trajectory_key: Any = None,
        ends: torch.Tensor | None = None,
        trajectories: torch.Tensor | None = None,
        cache_values: bool = False,
        truncated_key: Any = ("next", "truncated"),
        strict_length: bool = True,
        compile: bool | dict = False,
        span: bool | int | tuple[bool | int, bool | int] = False,
        use_gpu: bool | torch.device = False,
        max_priority_within_buffer: bool = False,
        device: str | torch.device | None = None,
        backend: str | None = None,
        skip_stale_updates: bool = True,
        validate: bool | None = None,
    ) -> None:
        PrioritizedSampler.__init__(
            self, max_capacity, alpha, beta, eps=eps, dtype=dtype, reduction=reduction,
            max_priority_within_buffer=max_priority_within_buffer, device=device,
            backend=backend, skip_stale_updates=skip_stale_updates, validate=validate)
        SliceSampler.__init__(
            self, num_slices=num_slices, slice_len=slice_len, end_key=end_key,
            traj_key=traj_key, trajectory_key=trajectory_key, ends=ends,
            trajectories=trajectories, cache_values=cache_values, truncated_key=truncated_key,
            strict_length=strict_length, compile=compile, span=span, use_gpu=use_gpu)
        if self.span[0]:
            raise ValueError("PrioritizedSliceSampler supports span on the right only "
                             f"(span=(False, ...)), got span={span!r}.")

    # ---- writes ------------------------------------------------------------------------------
    def extend(self, slots: torch.Tensor) -> None:
        PrioritizedSampler.extend(self, slots)
        self._index.note_write(slots)

    def mark_update(self, slots: torch.Tensor) -> None:
        PrioritizedSampler.extend(self, slots)  # rewritten steps get the max priority again
        self._rewritten()

    def empty(self) -> None:
        PrioritizedSampler.empty(self)
        SliceSampler.empty(self)

    # ---- sampling ----------------------------------------------------------------------------
    def _min_steps(self, lengths: np.ndarray, seq_len: int) -> np.ndarray:
        """Steps that must follow (and include) a start in a trajectory of ``lengths`` steps.

        ``0`` marks a trajectory that cannot start any slice (too short, ``strict_length``).
        """
        right = self.span[1]
        overhang = seq_len - 1 if right is True else int(right)
        if self.strict_length:
            need = np.full_like(lengths, max(seq_len - overhang, 1))
            return np.where(lengths >= seq_len, need, 0)
        return np.maximum(np.minimum(lengths, seq_len) - overhang, 1)

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
        owner, offset = _ragged_arange(tail)
        pos = rec[owner, START] + lengths[owner] - tail[owner] + offset
        return torch.from_numpy(index.slots_of(rec[owner, LANE], pos))

    def _draw(self, storage: Storage, n: int) -> tuple[np.ndarray, torch.Tensor]:
        slots, info = PrioritizedSampler.sample(self, storage, n)
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
        for _ in range(_REJECTION_ROUNDS):
            need -= draw(need + need // 2 + 8, need)
            if need == 0:
                break
        else:
            # most of the priority mass sits on steps that cannot start a slice: mask them
            lengths = index.rec[index.live_records(), LEN]
            if not (self._min_steps(lengths, seq_len) > 0).any():
                raise self._no_trajectory_error(index, seq_len)
            masked = self._masked_starts(index, seq_len).to(self._device)
            saved = self._sum.get(masked)
            self._sum.update(masked, torch.zeros_like(saved) if isinstance(saved, torch.Tensor)
                             else 0.0)
            try:
                while need:
                    need -= draw(need, need)
            finally:
                self._sum.update(masked, saved)
        lanes, pos, room, weights = zip(*parts)
        return np.concatenate(lanes), np.concatenate(pos), np.concatenate(room), torch.cat(weights)

    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict[str, Any]]:
        num_slices, seq_len = self._slice_shape(batch_size)
        self._check_sampleable(storage, seq_len)
        self._ensure_trees(storage)
        index = self._sync(storage)
        if index.num_trajectories == 0:
            raise RuntimeError("the buffer holds no trajectory to sample from.")
        lanes, first, room, weights = self._draw_starts(storage, index, num_slices, seq_len)
        slots, ends, owner = _slice_slots(index, lanes, first, np.minimum(room, seq_len), seq_len)
        info = self._truncation_info(storage, slots, ends)
        # (repeat_interleave with a tensor of repeats costs milliseconds on CPU)
        info[PRIORITY_WEIGHT_KEY] = weights.repeat_interleave(seq_len) if owner is None \
            else weights[torch.from_numpy(owner)]
        info[WRITE_GENERATION_KEY] = self.slot_generation(slots)
        return slots, info

    # ---- state -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {**PrioritizedSampler.state_dict(self), "index": self._index.state_dict()}

    def check_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not isinstance(state_dict, dict) or "index" not in state_dict:
            raise ValueError(f"{type(self).__name__} state_dict must hold the priorities and an "
                             "'index' entry.")
        PrioritizedSampler.check_state_dict(
            self, {k: v for k, v in state_dict.items() if k != "index"})
        TrajectoryIndex.check_state_dict(state_dict["index"])

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.check_state_dict(state_dict)
        self._apply_state({k: v for k, v in state_dict.items() if k != "index"})
        self._load_index(state_dict["index"])

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(max_capacity={self.max_capacity}, alpha={self.alpha}, "
                f"beta={self.beta}, {self._repr_args()}, span={self.span})")
