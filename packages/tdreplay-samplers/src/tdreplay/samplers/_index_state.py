"""The checkpoint of a :class:`~tdreplay.samplers._trajectory_index.TrajectoryIndex`: its
``state_dict`` and ``install`` (:class:`IndexStateMixin`, mixed into it) and the check of a
saved state (:func:`check_index_state`), which a damaged checkpoint must not get past: the
compiled kernels walk the tables without bounds checks."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ._index_layout import (
    DPOS,
    EMPTY_I64,
    HEAD,
    LANE,
    LEN,
    MODE_ISOLATED,
    MODE_LANES,
    N_FREE,
    N_HIGH,
    N_LIVE,
    NEXT,
    START,
    TAIL,
    slot_dtype,
)

__all__ = ["STATE_KEYS", "IndexStateMixin", "check_index_state"]


class IndexStateMixin:
    """``state_dict``, ``load_state_dict`` and ``install`` of a trajectory index."""

    mode: int
    T: int
    C: int
    lanes: int
    ring_lanes: int
    n_end: int
    n_chunks: int
    newest_slot: int
    needs_rebuild: bool
    multi: bool
    _rebase: bool
    pending: list[list[int]]
    rec: np.ndarray
    dense: np.ndarray
    free: np.ndarray
    counters: np.ndarray
    lanes_arr: np.ndarray
    slot_rec: np.ndarray
    numbering: int
    track_slots: bool
    _storage_ref: Any
    _trust_storage: bool

    def state_dict(self) -> dict[str, Any]:
        high = int(self.counters[N_HIGH])
        meta = [self.mode, self.T, self.C, self.lanes, self.n_end, self.n_chunks,
                self.newest_slot, int(self.needs_rebuild), int(self._rebase), int(self.multi)]
        return {
            "meta": torch.tensor(meta, dtype=torch.long),
            "pending": torch.tensor(self.pending, dtype=torch.long).reshape(-1, 3),
            "records": torch.from_numpy(self.rec[:high].copy()),
            "dense": torch.from_numpy(self.dense[: int(self.counters[N_LIVE])].copy()),
            "free": torch.from_numpy(self.free[: int(self.counters[N_FREE])].copy()),
            "counters": torch.from_numpy(self.counters.copy()),
            "lanes": torch.from_numpy(self.lanes_arr.copy()),
            "slot_rec": torch.from_numpy(self.slot_rec.astype(np.int64)),
        }

    @staticmethod
    def check_state_dict(state: Any) -> None:
        """Raise ``ValueError`` unless ``state`` is a valid :meth:`state_dict` (see
        :func:`check_index_state`)."""
        check_index_state(state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.check_state_dict(state)
        self.install(state)

    def install(self, state: dict[str, Any]) -> None:
        """Load a state :meth:`check_state_dict` accepted (what a sampler that checked its
        whole state calls: the check walks every record)."""
        meta = [int(x) for x in state["meta"]]
        (self.mode, self.T, self.C, self.lanes, self.n_end, self.n_chunks, self.newest_slot,
         rebuild, rebase, multi) = meta
        self.needs_rebuild, self._rebase, self.multi = bool(rebuild), bool(rebase), bool(multi)
        self.ring_lanes = 1 if self.multi else max(self.lanes, 1)
        self.pending = [list(map(int, row)) for row in state["pending"].tolist()]
        live, high, nfree = (int(x) for x in state["counters"])
        cap = max(high, 1)
        self.rec = np.zeros((cap, 5), dtype=np.int64)
        self.rec[:high] = state["records"].numpy()
        self.dense = np.zeros(cap, dtype=np.int64)
        self.dense[:live] = state["dense"].numpy()
        self.free = np.zeros(cap, dtype=np.int64)
        self.free[:nfree] = state["free"].numpy()
        self.counters = state["counters"].numpy().copy()
        self.lanes_arr = state["lanes"].numpy().copy()
        self.numbering += 1
        slot_rec = state["slot_rec"].numpy() if self.track_slots else EMPTY_I64
        self.slot_rec = slot_rec.astype(slot_dtype(slot_rec.size))
        if self.track_slots and self.slot_rec.size == 0 and self.T:
            self.needs_rebuild = True
        self._storage_ref = None
        self._trust_storage = True


STATE_KEYS = ("meta", "pending", "records", "dense", "free", "counters", "lanes", "slot_rec")


def _check_signals(signals: Any) -> None:
    """Raise ``ValueError`` unless ``signals`` (a slice sampler's, saved with its index) is
    ``None`` or ``[traj key or None, list of end keys or None]``."""
    def is_key(key: Any) -> bool:
        return isinstance(key, str) or (isinstance(key, tuple) and len(key) > 0
                                        and all(isinstance(part, str) for part in key))

    if signals is None:
        return
    if isinstance(signals, (list, tuple)) and len(signals) == 2:
        traj, ends = signals
        if (traj is None or is_key(traj)) and (ends is None or (
                isinstance(ends, (list, tuple)) and all(is_key(key) for key in ends))):
            return
    raise ValueError(f"trajectory index state 'signals' must be None or [trajectory key or "
                     f"None, list of end keys or None], got {signals!r}.")


def check_index_state(state: Any) -> None:
    """Raise ``ValueError`` unless ``state`` is a :meth:`TrajectoryIndex.state_dict` whose
    tables the compiled kernel can walk: shapes that match the counters and the geometry,
    every record id inside the table, each lane a chain of live records in time order
    (no cycle) from its head to its tail. A damaged state would otherwise make the kernel
    read and write outside its arrays.

    Examples
    --------
    >>> from tdreplay.samplers._trajectory_index import TrajectoryIndex
    >>> state = TrajectoryIndex().state_dict()
    >>> check_index_state(state)
    >>> state["lanes"] = torch.zeros(0, 3, dtype=torch.long)
    >>> check_index_state(state)
    Traceback (most recent call last):
    ...
    ValueError: trajectory index state 'pending'/'lanes' have the wrong shape.
    """
    if not isinstance(state, dict) or set(state) - {"signals"} != set(STATE_KEYS):
        got = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"trajectory index state must have keys {sorted(STATE_KEYS)} (and "
                         f"'signals'), got {got}.")
    _check_signals(state.get("signals"))
    for key in STATE_KEYS:
        value = state[key]
        if not isinstance(value, torch.Tensor) or value.dtype != torch.long:
            raise ValueError(f"trajectory index state {key!r} must be an int64 tensor.")
    meta, counters = state["meta"], state["counters"]
    if meta.shape != (10,) or counters.shape != (3,):
        raise ValueError("trajectory index state 'meta'/'counters' have the wrong shape.")
    live, high, nfree = (int(x) for x in counters)
    if min(live, nfree) < 0 or state["records"].shape != (high, 5) \
            or state["dense"].shape != (live,) or state["free"].shape != (nfree,) \
            or live + nfree != high:
        raise ValueError("trajectory index state: record tables do not match its counters.")
    if state["pending"].ndim != 2 or state["pending"].shape[1] != 3 \
            or state["lanes"].ndim != 2 or state["lanes"].shape[1] != 4:
        raise ValueError("trajectory index state 'pending'/'lanes' have the wrong shape.")
    _check_geometry(meta.tolist(), state)
    _check_records(state, live, high)


def _check_geometry(meta: list[int], state: dict[str, torch.Tensor]) -> None:
    """The saved geometry (``meta``), its lanes table, pending writes and slot records agree."""
    mode, T, C, lanes, n_end, n_chunks, newest, *flags = meta
    if mode not in (MODE_LANES, MODE_ISOLATED) or min(T, C, lanes, n_end, n_chunks) < 0 \
            or (T == 0) != (C == 0) or (T == 0 and mode != MODE_LANES) or newest < -1 \
            or any(f not in (0, 1) for f in flags):
        raise ValueError(f"trajectory index state 'meta' is not a geometry: {meta}.")
    rows = state["lanes"].shape[0]
    if rows != lanes and not (lanes == 0 and rows <= 1) \
            or (mode == MODE_ISOLATED and (lanes != C or n_chunks > C)):
        raise ValueError(f"trajectory index state 'lanes' has {rows} lanes, its geometry "
                         f"{lanes} (mode {mode}, {C} chunks).")
    pending = state["pending"]  # (before the first sync, T == 0: checked when applied)
    if pending.numel() and (int(pending[:, 0].min()) < 0 or int(pending[:, 1:].min()) < 1
                            or T and int((pending[:, 0] + pending[:, 1]).max()) > C * T):
        raise ValueError("trajectory index state 'pending' names writes outside the storage.")
    slot_rec = state["slot_rec"]
    if slot_rec.shape not in ((0,), (C * T,)):
        raise ValueError(f"trajectory index state 'slot_rec' has shape {tuple(slot_rec.shape)}"
                         f", not one record per slot ({C * T}).")


def _check_records(state: dict[str, torch.Tensor], live: int, high: int) -> None:
    """Every record id inside the table; the dense and free lists split it; each lane a chain
    of its live records with strictly later positions, from its head to its tail."""
    rec, dense, free = state["records"], state["dense"], state["free"]
    if not bool(torch.equal(torch.cat([dense, free]).sort().values, torch.arange(high))):
        raise ValueError("trajectory index state: the dense and free lists do not split the "
                         "record table.")
    lanes = state["lanes"]
    heads, tails = lanes[:, HEAD], lanes[:, TAIL]
    slot_rec = state["slot_rec"]
    for name, ids in (("lane heads", heads), ("lane tails", tails), ("slot_rec", slot_rec)):
        if ids.numel() and (int(ids.min()) < -1 or int(ids.max()) >= high):
            raise ValueError(f"trajectory index state: {name} point outside the record table.")
    if not bool(torch.equal(heads < 0, tails < 0)):
        raise ValueError("trajectory index state: a lane has a head without a tail or the "
                         "reverse.")
    is_live = torch.zeros(high, dtype=torch.bool)
    is_live[dense] = True
    rows = rec[dense]
    nxt = rows[:, NEXT]
    if live and (bool((rows[:, DPOS] != torch.arange(live)).any())
                 or int(rows[:, LANE].min()) < 0 or int(rows[:, LANE].max()) >= lanes.shape[0]
                 or int(rows[:, START].min()) < 0 or int(rows[:, LEN].min()) < 1
                 or int(nxt.min()) < -1 or int(nxt.max()) >= high):
        raise ValueError("trajectory index state: a live record has a lane, position, length "
                         "or link outside the index.")
    linked = nxt[nxt >= 0]
    used = heads[heads >= 0]
    targets = torch.cat([linked, used])
    # each live record is reached exactly once (from its predecessor or as its lane's head),
    # by a record of its lane that ends before it starts: chains, no cycle, one per lane
    if not bool(is_live[targets].all()) or targets.numel() != live \
            or torch.unique(targets).numel() != live:
        raise ValueError("trajectory index state: the lanes do not chain every live record "
                         "exactly once.")
    has_next = nxt >= 0
    before, after = rows[has_next], rec[nxt[has_next]]
    if bool((before[:, LANE] != after[:, LANE]).any()) \
            or bool((after[:, START] < before[:, START] + before[:, LEN]).any()):
        raise ValueError("trajectory index state: a record links to one of another lane or "
                         "an earlier position.")
    occupied = torch.nonzero(heads >= 0).reshape(-1)
    if bool((rec[heads[occupied], LANE] != occupied).any()) \
            or bool((rec[tails[occupied], LANE] != occupied).any()) \
            or bool((rec[tails[occupied], NEXT] != -1).any()) \
            or not bool(is_live[tails[occupied]].all()):
        raise ValueError("trajectory index state: a lane's head or tail is not a record of "
                         "that lane ending its chain.")
