"""Fixed-length windows cut from the stream of writes, for ``StreamingSliceSampler``.

Why
---
A streaming sampler returns each stretch of ``window`` consecutive steps once, as soon as it is
complete, before any uniform slice. :class:`StreamWindows` does the bookkeeping: it stamps every
written slot with a write count (its *version*), cuts the written steps into non-overlapping
windows that never cross a trajectory boundary, queues them, and hands out those whose slots
still hold the steps they were cut from (an overwritten window is dropped).

Writes are cut lazily
---------------------
A sampler learns *which* slots were written (``extend(slots)``), not what they hold: the
storage is only passed to ``sample``. So a write is stamped at once and logged, and the log is
cut into windows at the next ``sample`` (:meth:`StreamWindows.unread`, then
:meth:`StreamWindows.absorb` with the boundary signals read from the storage). While fewer
steps than the buffer holds are written between two samples, nothing is overwritten in
between and the windows are those of cutting each write as it comes (TorchRL's). Steps
overwritten before they were cut cannot be read any more: they are taken to hold no boundary,
which keeps the later windows where cutting at write time put them (the windows holding them
are never served). Only when the buffer laps between two samples are the oldest writes,
overwritten whole, dropped from the log: the stream starts anew after them.

Every cut is plain numpy over arrays read beforehand, so a sample that fails reading the
signals leaves the bookkeeping as it was.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np
import torch

from ._slicing import ragged_arange

__all__ = ["StreamWindows", "WindowLengthError"]


class WindowLengthError(ValueError, RuntimeError):
    """A state of windows of another length: a ``ValueError`` and, as TorchRL's error for it,
    a ``RuntimeError``."""

_EMPTY = np.zeros(0, dtype=np.int64)
_MIN_SCAN = 16  # windows looked at together when handing out fresh ones


class StreamWindows:
    """Write stamps, the log of writes not yet cut, the partial window carried from one write
    to the next, and the queue of complete windows (a ring of ``capacity // window`` rows, as
    many disjoint windows as a buffer of ``capacity`` steps can hold).

    Examples
    --------
    >>> stream = StreamWindows(window=3)
    >>> stream.note_write(torch.arange(7))
    >>> to_read, fresh = stream.unread()
    >>> to_read.tolist()
    [0, 1, 2, 3, 4, 5, 6]
    >>> done = np.zeros(7, dtype=bool)
    >>> stream.absorb(fresh, ids=None, done=done, init=np.zeros(7, dtype=bool), capacity=16)
    >>> windows, position = stream.take(4)
    >>> windows.tolist(), stream.pending_slots.tolist()   # step 6 waits for two more steps
    ([[0, 1, 2], [3, 4, 5]], [6])
    """

    def __init__(self, window: int) -> None:
        self.window = window
        self.reset()

    def reset(self) -> None:
        """Forget every write (the buffer was emptied)."""
        self.versions = _EMPTY.copy()  # write count of every slot seen
        self.log: deque[tuple[np.ndarray, np.ndarray]] = deque()  # (slots, stamps) not cut yet
        self.logged = 0  # steps in the log
        self._break()
        self.last_done = False  # (nothing written yet)
        self.q_slots = np.zeros((0, self.window), dtype=np.int64)
        self.q_stamps = np.zeros((0, self.window), dtype=np.int64)
        self.q_start = 0  # the queue holds windows q_start <= j < q_end, window j in row j % cap
        self.q_end = 0

    def _break(self) -> None:
        """The next step starts a new stream (no partial window continues into it)."""
        self.pending_slots = _EMPTY
        self.pending_stamps = _EMPTY
        self.last_traj: int | None = None
        self.last_done = True

    # ---- writes --------------------------------------------------------------------------------
    def note_write(self, slots: torch.Tensor) -> None:
        """Stamp ``slots`` (flat, in write order) and log them to be cut at the next sample."""
        arr = slots.reshape(-1).cpu().numpy().astype(np.int64)
        if arr.size == 0:
            return
        high = int(arr.max()) + 1
        if high > self.versions.size:
            grown = np.zeros(max(high, 2 * self.versions.size), dtype=np.int64)
            grown[: self.versions.size] = self.versions
            self.versions = grown
        self.log.append((arr, self._stamp(arr)))
        self.logged += arr.size
        if self.logged > self.versions.size:  # some logged step was overwritten since
            self._drop_overwritten_writes()

    def _stamp(self, arr: np.ndarray) -> np.ndarray:
        """Count one more write of each slot; the count of each occurrence (a slot written twice
        in one write gets two)."""
        if arr.size == 1 or bool((np.diff(arr) == 1).all()) or np.unique(arr).size == arr.size:
            stamps = self.versions[arr] + 1
            self.versions[arr] = stamps
            return stamps
        stamps = np.empty_like(arr)
        for i, slot in enumerate(arr.tolist()):
            self.versions[slot] += 1
            stamps[i] = self.versions[slot]
        return stamps

    def _drop_overwritten_writes(self) -> None:
        """Drop the oldest logged writes whose every step was overwritten, leaving one empty
        write in their place: the stream breaks there (what cutting them would do), and the
        log stays as long as the buffer."""
        dropped = False
        while self.log and not bool((self.versions[self.log[0][0]] == self.log[0][1]).any()):
            self.logged -= self.log.popleft()[0].size
            dropped = True
        if dropped:
            self.log.appendleft((_EMPTY, _EMPTY))

    # ---- cutting -------------------------------------------------------------------------------
    def unread(self) -> tuple[np.ndarray, list[np.ndarray]]:
        """Slots of the logged steps that still hold their write (to read the boundary signals
        of, in log order) and, per logged write, which of its steps they are."""
        fresh = [self.versions[slots] == stamps for slots, stamps in self.log]
        parts = [slots[mask] for (slots, _), mask in zip(self.log, fresh)]
        return (np.concatenate(parts) if parts else _EMPTY), fresh

    def absorb(self, fresh: list[np.ndarray], *, ids: np.ndarray | None, done: np.ndarray,
               init: np.ndarray, capacity: int) -> None:
        """Cut the logged writes into windows and queue them, as if each had been cut when it
        was written (TorchRL's way).

        ``fresh``: the masks :meth:`unread` returned; ``ids`` (trajectory ids, or ``None``),
        ``done`` (end flags) and ``init`` (``is_init`` flags): one per slot it returned.
        ``capacity``: steps the buffer holds: a write keeps its last ``capacity`` steps and the
        queue the newest ``capacity // window`` windows (older ones were overwritten).
        """
        self._resize_queue(max(capacity // self.window, 1))
        # write counts as each write left them: the counts before the log, then each write's
        asof = self.versions.copy()
        for slots, stamps in self.log:
            np.minimum.at(asof, slots, stamps - 1)
        offset = 0
        for (slots, stamps), mask in zip(self.log, fresh):
            np.maximum.at(asof, slots, stamps)
            cut = max(slots.size - capacity, 0)
            skip, n = int(mask[:cut].sum()), int(mask.sum())
            part = slice(offset + skip, offset + n)
            self._cut(slots[cut:], stamps[cut:], mask[cut:], asof,
                      None if ids is None else ids[part], done[part], init[part])
            offset += n
        self.log.clear()
        self.logged = 0

    def _cut(self, slots: np.ndarray, stamps: np.ndarray, known: np.ndarray, asof: np.ndarray,
             ids: np.ndarray | None, done: np.ndarray, init: np.ndarray) -> None:
        """Queue the windows one write completes; keep its unfinished tail as pending.

        ``known``: its steps still stored, whose signals ``ids``, ``done`` and ``init`` were
        read. The others were overwritten since: they are taken to hold no boundary (their
        windows are never served, they only keep the later windows where they were)."""
        n = slots.size
        if n == 0:  # (writes dropped from the log: see _drop_overwritten_writes)
            self._break()
            return
        ends = np.zeros(n, dtype=np.bool_)
        ends[known] = done
        # a trajectory starts before step i: is_init, the previous step ended one or the id
        # changes
        before = np.zeros(n, dtype=np.bool_)
        before[known] = init
        before[1:] |= ends[:-1]
        every_id = None if ids is None else self._fill_ids(known, ids)
        if every_id is not None:
            before[1:] |= every_id[1:] != every_id[:-1]
            if self.last_traj is not None:
                before[0] |= bool(every_id[0] != self.last_traj)
        before[0] |= self.last_done
        if self.pending_slots.size and not bool(
                (asof[self.pending_slots] == self.pending_stamps).all()):
            self.pending_slots = self.pending_stamps = _EMPTY  # the partial window was rewritten
        steps, step_stamps = slots, stamps
        lead = 0 if before[0] else self.pending_slots.size
        if lead:
            steps = np.concatenate([self.pending_slots, steps])
            step_stamps = np.concatenate([self.pending_stamps, step_stamps])
        starts = np.unique(np.concatenate([[0], np.flatnonzero(before) + lead]))
        lengths = np.diff(np.append(starts, steps.size))
        count = lengths // self.window
        owner, offset = ragged_arange(count)
        rows = (starts[owner] + offset * self.window)[:, None] + np.arange(self.window)
        self._enqueue(steps[rows], step_stamps[rows])
        tail = int(lengths[-1] - count[-1] * self.window)
        if tail and not ends[-1]:
            self.pending_slots, self.pending_stamps = steps[-tail:], step_stamps[-tail:]
        else:
            self.pending_slots = self.pending_stamps = _EMPTY
        if every_id is not None:
            self.last_traj = int(every_id[-1])
        self.last_done = bool(ends[-1])

    def _fill_ids(self, known: np.ndarray, ids: np.ndarray) -> np.ndarray | None:
        """Trajectory ids of every step: those read, and for an overwritten step the id before
        it (no change there)."""
        if ids.size == 0:
            return None
        last = np.maximum.accumulate(np.where(known, np.arange(known.size), -1))
        first = ids[0] if self.last_traj is None else self.last_traj
        place = np.cumsum(known) - 1  # the read id of each known step, by position
        return np.where(last >= 0, ids[place[np.maximum(last, 0)]], first)

    # ---- the queue -----------------------------------------------------------------------------
    def _resize_queue(self, cap: int) -> None:
        """A ring of ``cap`` rows, keeping the newest queued windows."""
        if self.q_slots.shape[0] == cap:
            return
        windows, stamps = self.queued()
        keep = min(cap, windows.shape[0])
        self.q_slots = np.zeros((cap, self.window), dtype=np.int64)
        self.q_stamps = np.zeros((cap, self.window), dtype=np.int64)
        self.q_start = self.q_end - keep  # (positions go on counting: see rewind)
        rows = np.arange(self.q_start, self.q_end) % cap
        self.q_slots[rows] = windows[windows.shape[0] - keep:]
        self.q_stamps[rows] = stamps[stamps.shape[0] - keep:]

    def _enqueue(self, windows: np.ndarray, stamps: np.ndarray) -> None:
        cap = self.q_slots.shape[0]
        m = windows.shape[0]
        if m == 0:
            return
        if m > cap:  # the oldest ones are already overwritten
            windows, stamps = windows[m - cap:], stamps[m - cap:]
            self.q_end += m - cap
            m = cap
        rows = (self.q_end + np.arange(m)) % cap
        self.q_slots[rows] = windows
        self.q_stamps[rows] = stamps
        self.q_end += m
        self.q_start = max(self.q_start, self.q_end - cap)

    def queued(self) -> tuple[np.ndarray, np.ndarray]:
        """The queued windows, oldest first: slots and stamps, ``[n, window]`` each."""
        cap = self.q_slots.shape[0]
        rows = np.arange(self.q_start, self.q_end) % max(cap, 1)
        return self.q_slots[rows], self.q_stamps[rows]

    def rewind(self, position: int) -> None:
        """Back to queue position ``position`` (an earlier :attr:`q_start`): the windows taken
        since are queued again, but those trimmed since (overwritten) stay out."""
        self.q_start = max(position, self.q_end - self.q_slots.shape[0])

    def take(self, want: int) -> tuple[np.ndarray, int]:
        """Up to ``want`` queued windows whose slots still hold them, oldest first, and the
        queue position after them (the overwritten windows passed over are dropped too). The
        caller commits the position (:attr:`q_start`) once its batch is made."""
        cap = self.q_slots.shape[0]
        start, end, n = self.q_start, self.q_end, 0
        found: list[np.ndarray] = []
        while start < end and n < want:
            stop = min(end, start + max(2 * (want - n), _MIN_SCAN))
            rows = np.arange(start, stop) % cap
            windows, stamps = self.q_slots[rows], self.q_stamps[rows]
            ok = (self.versions[windows] == stamps).all(axis=1)
            picked = np.flatnonzero(ok)[: want - n]
            found.append(windows[picked])
            n += picked.size
            start = start + int(picked[-1]) + 1 if n == want else stop
        windows = np.concatenate(found) if found else np.zeros((0, self.window), np.int64)
        return windows, start

    # ---- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, torch.Tensor]:
        windows, stamps = self.queued()
        log = list(self.log)
        return {
            "slot_versions": torch.from_numpy(self.versions.copy()),
            "queued_indices": torch.from_numpy(windows.copy()),
            "queued_versions": torch.from_numpy(stamps.copy()),
            "queue_capacity": torch.tensor(self.q_slots.shape[0], dtype=torch.long),
            "pending_indices": torch.from_numpy(self.pending_slots.copy()),
            "pending_versions": torch.from_numpy(self.pending_stamps.copy()),
            "last_traj": torch.tensor([] if self.last_traj is None else [self.last_traj],
                                      dtype=torch.long),
            "has_last_traj": torch.tensor(self.last_traj is not None),
            "last_was_done": torch.tensor(self.last_done),
            "unread_indices": torch.from_numpy(np.concatenate([_EMPTY] + [s for s, _ in log])),
            "unread_versions": torch.from_numpy(np.concatenate([_EMPTY] + [v for _, v in log])),
            "unread_sizes": torch.tensor([s.size for s, _ in log], dtype=torch.long),
            "slice_len": torch.tensor(self.window, dtype=torch.long),
        }

    def check_state_dict(self, state: dict[str, Any]) -> None:
        """Raise ``ValueError`` unless ``state`` is a :meth:`state_dict` of windows of this
        length, every slot it names stamped (:class:`WindowLengthError` for another length)."""
        length = state["slice_len"]
        if not isinstance(length, torch.Tensor) or length.numel() != 1:
            raise ValueError(f"streaming state 'slice_len' must be one int, got {length!r}.")
        if int(length) != self.window:
            raise WindowLengthError(f"cannot restore the windows of a slice_len={int(length)} "
                                    f"sampler into a slice_len={self.window} one.")
        for key in self.state_dict():
            value = state[key]
            if not isinstance(value, torch.Tensor):
                raise ValueError(f"streaming state {key!r} must be a tensor.")
            flag = key in ("has_last_traj", "last_was_done")
            if flag != (value.dtype is torch.bool) or not flag and value.dtype != torch.long:
                raise ValueError(f"streaming state {key!r} must be a "
                                 f"{'bool' if flag else 'int64'} tensor, got {value.dtype}.")
        versions, cap = state["slot_versions"], int(state["queue_capacity"])
        queued, queued_v = state["queued_indices"], state["queued_versions"]
        unread, sizes = state["unread_indices"], state["unread_sizes"]
        shapes_ok = (versions.ndim == 1 and queued.ndim == 2 and queued.shape == queued_v.shape
                     and queued.shape[1] == self.window and queued.shape[0] <= cap
                     and state["pending_indices"].shape == state["pending_versions"].shape
                     and state["pending_indices"].ndim == 1
                     and state["pending_indices"].numel() < self.window
                     and unread.ndim == 1 and unread.shape == state["unread_versions"].shape
                     and sizes.ndim == 1 and int(sizes.sum()) == unread.numel()
                     and state["last_traj"].numel() == int(state["has_last_traj"]))
        if not shapes_ok or (sizes.numel() and int(sizes.min()) < 0):
            raise ValueError(f"streaming state: queue, pending window or unread writes do not "
                             f"hold windows of {self.window} steps.")
        slots = torch.cat([queued.reshape(-1), state["pending_indices"], unread])
        if (versions.numel() and int(versions.min()) < 0) or slots.numel() and (
                int(slots.min()) < 0 or int(slots.max()) >= versions.numel()):
            raise ValueError("streaming state names slots it holds no write count of.")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Install a state :meth:`check_state_dict` accepted."""
        self.versions = state["slot_versions"].numpy().copy()
        sizes = state["unread_sizes"].tolist()
        bounds = np.cumsum([0, *sizes])
        unread, unread_v = state["unread_indices"].numpy(), state["unread_versions"].numpy()
        self.log = deque((unread[a:b].copy(), unread_v[a:b].copy())
                         for a, b in zip(bounds[:-1], bounds[1:]))
        self.logged = int(bounds[-1])
        self.pending_slots = state["pending_indices"].numpy().copy()
        self.pending_stamps = state["pending_versions"].numpy().copy()
        self.last_traj = int(state["last_traj"][0]) if bool(state["has_last_traj"]) else None
        self.last_done = bool(state["last_was_done"])
        cap = int(state["queue_capacity"])
        self.q_slots = np.zeros((cap, self.window), dtype=np.int64)
        self.q_stamps = np.zeros((cap, self.window), dtype=np.int64)
        self.q_start = self.q_end = 0
        self._enqueue(state["queued_indices"].numpy(), state["queued_versions"].numpy())
