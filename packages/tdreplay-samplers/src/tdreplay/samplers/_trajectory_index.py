"""Incremental trajectory bookkeeping shared by the slice samplers.

Why
---
A slice sampler must know where every trajectory of the buffer starts and ends. Computing that
from the storage at every ``sample`` (what TorchRL does unless ``cache_values=True``) costs a
pass over the whole buffer per batch. :class:`TrajectoryIndex` keeps the trajectories up to
date as data is written instead: a write of ``k`` steps costs ``O(k)`` (compiled loops) and a
batch costs ``O(batch)``, whatever the size of the buffer.

Geometry: lanes and positions
-----------------------------
With ``ndim == 1`` the flat storage is one ring of steps. With ``ndim > 1`` the storage is
time-major, as TorchRL's: shape ``[rows, *envs]``, one row per time step (the buffer writes
``[envs, T]`` batches along ``T``, see ``ReplayBuffer.dim_extend``), so slot ``r * E + e`` (``E
= prod(envs)`` lanes) holds step ``r`` of environment ``e``: a ring of rows with ``E`` lanes,
chunks of ``T == 1`` step (:func:`_geometry`). The general geometry below (chunks of ``T``
consecutive slots, one environment each, a write adding one chunk per *lane*) keeps ``T > 1``
for environment-major layouts. Chunks get a
sequence number ``n`` in write order; chunk ``n`` lives at physical chunk ``n % C`` (``C``
chunks in the storage) and belongs to lane ``n % lanes``. Within a lane, chunk ``n`` holds
positions ``(n // lanes) * T + [0, T)``, so the next write's chunk of the same environment
continues the lane: a trajectory that spans several writes stays one trajectory (as it would
in TorchRL's time-major layout). Position -> slot is plain arithmetic::

    n = (pos // T) * lanes + lane;   slot = (n % C) * T + pos % T

``ndim == 1`` is the special case ``T == 1, lanes == 1`` (position = write sequence number).

Boundaries: a trajectory ends where the trajectory id changes, after a step whose end flag is
set, at the newest written step of its lane (the write cursor: the oldest surviving step is
never glued after the newest one), and where the lane's older steps were overwritten.

Anything that breaks this ring geometry is still handled, by rebuilding the index from the
storage at the next ``sample`` (``O(buffer)`` once): index assignment (``rb[i] = ...``), a
writer that does not write round-robin (e.g. a max-value writer), a storage filled without the
sampler seeing the writes (datasets). After such a break, ``ndim == 1`` buffers order time by
slot with the cut after the newest written slot (TorchRL's rule); ``ndim > 1`` buffers switch to
*isolated* chunks: trajectories then never leave the ``T`` steps of one storage row (as when a
write has a different number of environments than the previous ones, since environments can
no longer be matched across writes).

Records
-------
Each trajectory is a record ``(lane, start position, length, next record in lane, position in
the dense list)``. The records of a lane form a linked list in time order, so overwriting the
oldest chunk only trims the heads of the lane's first records; the dense list of live records
makes a uniform draw over trajectories ``O(1)``. Optionally (prioritized slicing) each slot
also remembers its record, to answer "how many steps follow this slot in its trajectory".
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from numba import njit

from tdreplay.core.utils import restore_attributes

from ._index_layout import (
    DPOS,
    EMPTY_I64,
    HEAD,
    LANE,
    LAST_DONE,
    LAST_ID,
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
from ._index_state import IndexStateMixin
from ._kernel_cache import on_disk

_BLOCK = 1 << 22  # steps read from the storage at once during a rebuild


# ---------------------------------------------------------------------------------------------
# compiled kernels
# ---------------------------------------------------------------------------------------------
@on_disk
@njit(nogil=True)
def _write_chunks(rec, dense, free, counters, lanes_arr, slot_rec, ids, done, use_ids,
                  use_done, phys0, n0, nchunks, T, lanes, C, isolated, remove_old
                  ):  # pragma: no cover - compiled
    """Append ``nchunks`` chunks (physical ``phys0 + j``, sequence ``n0 + j``) to their lanes.

    ``ids`` / ``done`` hold the ``nchunks * T`` steps in slot order. With ``remove_old`` the
    chunk being overwritten is first removed from its lane: the oldest chunk of the buffer
    (the ``T`` oldest positions of its lane) in lane mode, the whole lane in isolated mode.

    Everything is written out in this one function on purpose: calling a compiled helper that
    takes arrays costs reference counting on each of them, more than the work per step.

    Returns the number of chunks written: fewer than ``nchunks`` when the record table has no
    room for the ``T`` records the next chunk may open (the caller grows it and goes on from
    there), so the table grows with the trajectories, not with the size of a write.
    """
    track = slot_rec.shape[0] > 0
    for j in range(nchunks):
        if counters[N_FREE] + rec.shape[0] - counters[N_HIGH] < T:
            return j
        c = phys0 + j
        n = n0 + j
        drop_lane = -1
        drop = 0  # positions to forget from the head of drop_lane (-1: all of them)
        if isolated:
            lane = c
            base = 0
            if remove_old:
                drop_lane = lane
                drop = -1
        else:
            if lanes == 1:
                lane = 0
                base = n * T
            else:
                lane = n % lanes
                base = (n // lanes) * T
            if remove_old and n >= C:
                drop_lane = 0 if lanes == 1 else (n - C) % lanes
                drop = T
        # forget the overwritten positions: trim or free the lane's oldest records
        remaining = drop
        while remaining != 0:
            r = lanes_arr[drop_lane, HEAD]
            if r < 0:
                lanes_arr[drop_lane, TAIL] = -1
                break
            ln = rec[r, LEN]
            if remaining > 0 and ln > remaining:
                rec[r, START] += remaining
                rec[r, LEN] = ln - remaining
                break
            if remaining > 0:
                remaining -= ln
            lanes_arr[drop_lane, HEAD] = rec[r, NEXT]
            if lanes_arr[drop_lane, HEAD] < 0:
                lanes_arr[drop_lane, TAIL] = -1
            # free record r: swap-remove it from the dense list
            p = rec[r, DPOS]
            last = dense[counters[N_LIVE] - 1]
            dense[p] = last
            rec[last, DPOS] = p
            counters[N_LIVE] -= 1
            free[counters[N_FREE]] = r
            counters[N_FREE] += 1
        # append the new steps
        for t in range(T):
            i = j * T + t
            pos = base + t
            idv = ids[i] if use_ids else 0
            dn = done[i] if use_done else False
            tail = lanes_arr[lane, TAIL]
            if (tail >= 0 and rec[tail, START] + rec[tail, LEN] == pos
                    and lanes_arr[lane, LAST_DONE] == 0
                    and (not use_ids or lanes_arr[lane, LAST_ID] == idv)):
                rec[tail, LEN] += 1
                r = tail
            else:
                if counters[N_FREE] > 0:
                    counters[N_FREE] -= 1
                    r = free[counters[N_FREE]]
                else:
                    r = counters[N_HIGH]
                    counters[N_HIGH] += 1
                p = counters[N_LIVE]
                dense[p] = r
                counters[N_LIVE] = p + 1
                rec[r, LANE] = lane
                rec[r, START] = pos
                rec[r, LEN] = 1
                rec[r, NEXT] = -1
                rec[r, DPOS] = p
                if tail >= 0:
                    rec[tail, NEXT] = r
                else:
                    lanes_arr[lane, HEAD] = r
                lanes_arr[lane, TAIL] = r
            lanes_arr[lane, LAST_ID] = idv
            lanes_arr[lane, LAST_DONE] = 1 if dn else 0
            if track:
                slot_rec[c * T + t] = r
    return nchunks


# ---------------------------------------------------------------------------------------------
# the index
# ---------------------------------------------------------------------------------------------
#: ``reader(storage, start, stop) -> (ids, done)``: int64 ids and bool end flags of the steps
#: in flat slots ``[start, stop)`` as numpy arrays (``None`` for a signal that is not used).
Reader = Callable[[Any, int, int], "tuple[np.ndarray | None, np.ndarray | None]"]

_EMPTY_BOOL = np.empty(0, dtype=np.bool_)
_MAX_PENDING = 4096
#: the arrays a sync may write in place (see :meth:`TrajectoryIndex.scratch`)
_TABLES = ("rec", "dense", "free", "counters", "lanes_arr", "slot_rec")
#: every attribute of an index: what a failed sync puts back and a scratch copy starts from.
#: Named here rather than read from ``__dict__``, which would make every attribute read of
#: the index about four times slower on CPython 3.11 (the tests check the list is complete)
STATE_ATTRS = ("track_slots", "numbering", "mode", "T", "multi", "C", "lanes", "ring_lanes",
               "n_end", "n_chunks", "newest_slot", "cut_after", "needs_rebuild", "pending",
               "_storage_ref", "_trust_storage", "_seen_revision", "_rebase", *_TABLES)


class TrajectoryIndex(IndexStateMixin):
    """Trajectories of a buffer, kept up to date from the slots written (see module docstring).

    ``note_write(slots)`` is cheap (it only records the written range); the work happens in
    :meth:`sync`, called by the sampler with the storage before each batch.
    """

    def __init__(self, *, track_slots: bool = False) -> None:
        self.track_slots = track_slots
        #: advances whenever the record ids are assigned anew (a reset, a rebuild, a load): a
        #: record id kept from before (an epoch's) names another trajectory, or none
        self.numbering = 0
        self.reset()

    # ---- state -----------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget everything (the buffer was emptied)."""
        self.mode = MODE_LANES
        self.T = 0  # steps per chunk, 0 while the geometry is unknown
        self.multi = False  # storage ndim > 1 (chunks are rows along time)
        self.C = 0  # chunks in the storage
        self.lanes = 0  # chunks per write (lane mode), 0 until the first write is seen
        self.ring_lanes = 1  # lanes of a flat ring (environments of a time-major storage)
        self.n_end = 0  # sequence number of the next chunk (lane mode)
        self.n_chunks = 0  # physical chunks written (isolated mode)
        self.newest_slot = -1  # last slot written, for re-basing a flat ring
        self.cut_after: int | None = None  # overrides newest_slot (static datasets)
        self.needs_rebuild = False
        self.pending: list[list[int]] = []  # [start slot, count, write size]
        self._storage_ref: Any = None
        self._trust_storage = False
        self._seen_revision: int | None = None  # storage.revision when the last sync ended
        self._alloc_arrays(0, 0, 0)

    def _alloc_arrays(self, n_records: int, n_lanes: int, n_slots: int) -> None:
        self.numbering += 1
        self.rec = np.zeros((max(n_records, 1), 5), dtype=np.int64)
        self.dense = np.zeros(max(n_records, 1), dtype=np.int64)
        self.free = np.zeros(max(n_records, 1), dtype=np.int64)
        self.counters = np.zeros(3, dtype=np.int64)
        self.lanes_arr = np.full((n_lanes, 4), -1, dtype=np.int64)
        self.lanes_arr[:, LAST_DONE] = 0
        self.slot_rec = _slot_records(n_slots if self.track_slots else 0)

    def _ensure_records(self, extra: int) -> None:
        """Make room for ``extra`` more records; the table grows by half when it must (the
        kernel asks for more room whenever the next chunk might not fit)."""
        live, high, nfree = (int(x) for x in self.counters)
        need = high + max(extra - nfree, 0)
        cap = self.rec.shape[0]
        if need <= cap:
            return
        new_cap = max(need, cap + cap // 2, 1024)
        rec = np.zeros((new_cap, 5), dtype=np.int64)
        rec[:cap] = self.rec
        dense = np.zeros(new_cap, dtype=np.int64)
        dense[:cap] = self.dense
        free = np.zeros(new_cap, dtype=np.int64)
        free[:cap] = self.free
        self.rec, self.dense, self.free = rec, dense, free

    @property
    def num_trajectories(self) -> int:
        return int(self.counters[N_LIVE])

    def live_records(self) -> np.ndarray:
        """Record ids of the live trajectories (a view into the dense list)."""
        return self.dense[: int(self.counters[N_LIVE])]

    # ---- notifications ---------------------------------------------------------------------------
    def note_write(self, slots: torch.Tensor) -> None:
        """Remember that ``slots`` (flat, in write order) were just written."""
        flat = slots.reshape(-1)
        k = flat.numel()
        if k == 0:
            return
        if flat.device.type != "cpu":
            flat = flat.cpu()
        arr = flat.numpy()
        if k > 1:
            breaks = np.flatnonzero(np.diff(arr) != 1) + 1
        else:
            breaks = EMPTY_I64
        self.newest_slot = int(arr[-1])
        if breaks.size > 8 or len(self.pending) > _MAX_PENDING:
            # not a ring write (or far too many writes between two batches): rebuild later
            self.pending.clear()
            self.needs_rebuild = True
            self._rebase = True
            return
        bounds = [0, *breaks.tolist(), k]
        for a, b in zip(bounds[:-1], bounds[1:]):
            start, count = int(arr[a]), b - a
            last = self.pending[-1] if self.pending else None
            if last is not None and last[0] + last[1] == start and last[2] == k:
                last[1] += count
            else:
                self.pending.append([start, count, k])

    def note_update(self) -> None:
        """Written steps changed in place: recompute the trajectories at the next sync."""
        self.needs_rebuild = True

    def forget_write_order(self) -> None:
        """Cut the ring where the data says, not after the newest write (a static dataset's
        flags, which alone cut it): recompute the trajectories at the next sync."""
        self._forget_history()

    _rebase = False  # the write order broke the ring: re-base (flat) or isolate chunks

    # ---- synchronisation -----------------------------------------------------------------------
    def sync(self, storage: Any, reader: Reader) -> None:
        """Bring the index up to date with ``storage`` (the buffer's storage).

        All or nothing: when it raises (``reader`` refusing the stored ids, a storage that
        cannot be read), the index is left as it was, so the next sync retries the same work
        (the writes it was told of stay pending). Every step it needs is read before the
        tables are touched; a rebuild fills new tables.
        """
        revision = storage.revision
        if self.is_current(storage):
            return
        saved = self._snapshot()
        try:
            self._sync(storage, reader, revision)
        except BaseException:
            restore_attributes(self, saved)
            raise

    def is_current(self, storage: Any) -> bool:
        """Whether :meth:`sync` has nothing to do for ``storage``: it was synced last, and
        nothing was written since (the geometry of a laid out storage never changes)."""
        return bool(storage is self._storage_ref and self.T and not self.pending
                    and not self.needs_rebuild and storage.revision == self._seen_revision
                    and self._alive_slots() == len(storage) > 0)

    def scratch(self, storage: Any) -> TrajectoryIndex:
        """An index that :meth:`sync` can bring up to date with ``storage`` without changing
        this one: this index itself when that sync has nothing to do (:meth:`is_current`),
        else a copy with tables of its own (``O(records)``: a sync writes the tables in
        place). What a question about the next batch (``can_sample``) syncs.

        Examples
        --------
        >>> from tdreplay.storages import LazyTensorStorage
        >>> storage = LazyTensorStorage(8)
        >>> storage.set(torch.arange(4), torch.zeros(4))
        >>> def reader(storage, start, stop):  # end flags: none set
        ...     return None, np.zeros(stop - start, dtype=np.bool_)
        >>> index = TrajectoryIndex()
        >>> index.note_write(torch.arange(4))
        >>> twin = index.scratch(storage)
        >>> twin.sync(storage, reader)
        >>> twin.num_trajectories, index.num_trajectories, len(index.pending)
        (1, 0, 1)
        >>> index.sync(storage, reader)
        >>> index.scratch(storage) is index
        True
        """
        if self.is_current(storage):
            return self
        twin = object.__new__(type(self))
        restore_attributes(twin, self._snapshot())
        for name in _TABLES:
            setattr(twin, name, getattr(self, name).copy())
        return twin

    def _snapshot(self) -> dict[str, Any]:
        """What :meth:`sync` puts back when it fails: the attributes, the tables by reference
        (a sync replaces them or writes into them only once nothing can fail, see
        :meth:`_apply_pending`) and a copy of the pending writes (a list it edits)."""
        saved = {name: getattr(self, name) for name in STATE_ATTRS}
        saved["pending"] = [list(run) for run in self.pending]
        return saved

    def _sync(self, storage: Any, reader: Reader, revision: int) -> None:
        T, C, multi, lanes, length = _geometry(storage)
        # a loaded (or unpickled) index meeting a storage: its trajectories are checked
        loaded = storage is not self._storage_ref and self._trust_storage and bool(self.T)
        if (storage is self._storage_ref and not self.pending and not self.needs_rebuild
                and self._seen_revision is not None and revision != self._seen_revision):
            # written by someone this index was not told of (another buffer sharing the
            # storage, another process): its write order is unknown
            self._forget_history()
            newest = _newest_written_slot(storage, lanes)
            if not multi and newest is not None:
                self.newest_slot = newest  # cut the flat ring there, as the writer's cursor
        if storage is not self._storage_ref:
            if not self._trust_storage and self._storage_ref is not None:
                self._forget_history()
            self._storage_ref = storage
            self._trust_storage = False
        if (T, C, multi, lanes) != (self.T, self.C, self.multi, self.ring_lanes):
            if self.T:
                self._forget_history()
            self._set_geometry(T, C, multi)
            self.ring_lanes = lanes
        if self.pending:
            self._apply_pending(storage, reader)
        if not self.needs_rebuild and self._alive_slots() != length:
            # the storage changed behind our back (pre-filled dataset, loaded storage, ...)
            self._forget_history()
        if self.needs_rebuild:
            self._rebuild(storage, reader, length)
        elif loaded:
            self._check_loaded(storage, reader)
        self._seen_revision = storage.revision

    def _check_loaded(self, storage: Any, reader: Reader) -> None:
        """Recompute the trajectories of ``storage`` (``O(buffer)``, once per load) and keep
        this loaded index only when it holds the same ones. Else (a state saved with other
        data: its slices would cross trajectories) the storage's are taken, with a warning;
        the record ids are new (an epoch of ``SliceSamplerWithoutReplacement`` starts
        again)."""
        fresh = TrajectoryIndex(track_slots=self.track_slots)
        fresh.cut_after = self.cut_after
        fresh.sync(storage, reader)
        if fresh.live_spans() == self.live_spans():
            return
        warnings.warn("the slice sampler's saved trajectories are not those of the storage it "
                      "samples (was its state saved with other data?): they are recomputed "
                      "from the storage.", RuntimeWarning, stacklevel=2)
        numbering = self.numbering
        restore_attributes(self, {name: getattr(fresh, name) for name in STATE_ATTRS})
        self.numbering = max(numbering, fresh.numbering) + 1  # (the old ids name nothing)

    def _set_geometry(self, T: int, C: int, multi: bool) -> None:
        self.T, self.C, self.multi = T, C, multi
        if not multi:
            self.mode = MODE_LANES
        if self.track_slots:
            self.slot_rec = _slot_records(C * T)

    def _forget_history(self) -> None:
        """Write order unknown: rebuild in slot order (flat) or with isolated chunks."""
        self.pending.clear()
        self.needs_rebuild = True
        self._rebase = True
        self.newest_slot = -1

    def _alive_slots(self) -> int:
        if self.mode == MODE_LANES:
            return min(self.n_end, self.C) * self.T
        return self.n_chunks * self.T

    def _apply_pending(self, storage: Any, reader: Reader) -> None:
        T, C = self.T, self.C
        runs: list[tuple[int, int, int]] = []  # (physical chunk, sequence, chunks)
        new_chunks = 0
        n_cur = self.n_end
        broken = False
        for start, count, wsize in self.pending:
            if start % T or count % T or wsize % T or start + count > C * T:
                broken = True
                break
            k = count // T
            if self.mode == MODE_LANES:
                per_write = wsize // T if self.multi else self.ring_lanes
                if self.lanes == 0:
                    self.lanes = per_write
                    self.lanes_arr = np.full((per_write, 4), -1, dtype=np.int64)
                    self.lanes_arr[:, LAST_DONE] = 0
                if per_write != self.lanes or start != (n_cur % C) * T:
                    broken = True
                    break
                runs.append((start // T, n_cur, k))
                n_cur += k
            else:
                runs.append((start // T, 0, k))
            new_chunks += k
        self.pending.clear()
        if broken:
            self.needs_rebuild = True
            self._rebase = True
            return
        if self.mode == MODE_LANES:
            self.n_end = n_cur
        else:
            self.n_chunks = max([self.n_chunks] + [c + k for c, _, k in runs])
        if self.needs_rebuild or new_chunks >= C:
            self.needs_rebuild = True
            return
        # read every new step first: the kernel edits the tables in place, so whatever can
        # fail (the reader refusing the ids) must fail before it runs (see sync)
        blocks = [(phys + d, n0 + d, m, *self._read(storage, reader, phys + d, m))
                  for phys, n0, k in runs for d, m in self._blocks(k)]
        for phys, n0, m, ids, done in blocks:
            self._feed(ids, done, phys, n0, m, remove_old=True)

    def _blocks(self, k: int) -> list[tuple[int, int]]:
        """``(offset, count)`` of the blocks of at most ``_BLOCK`` steps ``k`` chunks are
        read in."""
        per_block = max(_BLOCK // self.T, 1)
        return [(d, min(per_block, k - d)) for d in range(0, k, per_block)]

    def _read(self, storage: Any, reader: Reader, phys: int, m: int
              ) -> tuple[np.ndarray | None, np.ndarray | None]:
        """Ids and end flags of the ``m`` chunks from physical chunk ``phys``."""
        a = phys * self.T
        return reader(storage, a, a + m * self.T)

    def _write(self, storage: Any, reader: Reader, phys: int, n0: int, k: int,
               remove_old: bool) -> None:
        """Read chunks ``[phys, phys + k)`` (sequence ``n0...``) and feed them to the kernel,
        block by block (a rebuild: it fills tables of its own, see :meth:`sync`)."""
        for d, m in self._blocks(k):
            ids, done = self._read(storage, reader, phys + d, m)
            self._feed(ids, done, phys + d, n0 + d, m, remove_old)

    def _feed(self, ids: np.ndarray | None, done: np.ndarray | None, phys: int, n0: int,
              m: int, remove_old: bool) -> None:
        """Append the ``m`` chunks read from physical chunk ``phys`` (sequence ``n0...``)."""
        T = self.T
        off = 0
        while off < m:  # the kernel stops early when the record table is full
            self._ensure_records(T)
            off += _write_chunks(
                self.rec, self.dense, self.free, self.counters, self.lanes_arr,
                self.slot_rec, EMPTY_I64 if ids is None else ids[off * T:],
                _EMPTY_BOOL if done is None else done[off * T:], ids is not None,
                done is not None, phys + off, n0 + off, m - off,
                T, max(self.lanes, 1), self.C, self.mode == MODE_ISOLATED, remove_old)

    def _rebuild(self, storage: Any, reader: Reader, length: int) -> None:
        """Recompute every trajectory from the storage (``O(buffer)``). When they come out
        as the same records (a rewrite that changed no trajectory, or a refused write that
        changed nothing), the record ids keep their numbering: what names them (an epoch of
        :class:`~tdreplay.samplers.SliceSamplerWithoutReplacement`) still holds."""
        numbering, spans = self.numbering, self._record_spans()
        self._rebuild_tables(storage, reader, length)
        if np.array_equal(spans, self._record_spans()):
            self.numbering = numbering

    def live_spans(self) -> set[tuple[int, int]]:
        """``(first slot, length)`` of every live trajectory, whatever its record id."""
        spans = self._record_spans()
        return {(int(first), int(n)) for first, n in spans[spans[:, 0] >= 0]}

    def _record_spans(self) -> np.ndarray:
        """``(first slot, length)`` of every record id in use (``-1`` for free ids): which
        steps each id names."""
        live, high = int(self.counters[0]), int(self.counters[1])
        spans = np.full((high, 2), -1, dtype=np.int64)
        if live and self.T:
            ids = self.dense[:live]
            rec = self.rec[ids]
            spans[ids, 0] = self.slots_of(rec[:, LANE], rec[:, START])
            spans[ids, 1] = rec[:, LEN]
        return spans

    def _rebuild_tables(self, storage: Any, reader: Reader, length: int) -> None:
        T, C = self.T, self.C
        filled = length // T
        self.needs_rebuild = False
        if self.mode == MODE_LANES and (self._rebase or min(self.n_end, C) != filled):
            if self.multi:
                self.mode = MODE_ISOLATED
            else:
                # flat ring: time follows slot order, cut after the newest written slot
                newest = self.cut_after if self.cut_after is not None else self.newest_slot
                written = _newest_written_slot(storage, self.ring_lanes)
                if newest < 0 and written is not None:
                    # write order unknown here (a buffer built on a written or restored
                    # storage): the storage records where its writer stopped
                    newest = written
                if filled == C and 0 <= newest < C:
                    self.n_end = newest + 1 + C
                else:
                    self.n_end = filled
                self.lanes = self.ring_lanes
        self._rebase = False
        n_slots = C * T if self.track_slots else 0
        if self.mode == MODE_LANES:
            self._alloc_arrays(1024, max(self.lanes, 1), n_slots)
            alive = min(self.n_end, C)
            n = self.n_end - alive
            while n < self.n_end:
                phys = n % C
                k = min(self.n_end - n, C - phys)
                self._write(storage, reader, phys, n, k, remove_old=False)
                n += k
        else:
            self.lanes = C
            self.n_chunks = filled
            self._alloc_arrays(1024, C, n_slots)
            if filled:
                self._write(storage, reader, 0, 0, filled, remove_old=False)

    def __getstate__(self) -> dict[str, Any]:
        # the storage travels with the buffer; the unpickled index trusts the one it next sees
        state = self.__dict__.copy()
        state["_storage_ref"] = None
        state["_trust_storage"] = True
        return state

    # ---- position <-> slot ----------------------------------------------------------------------
    def slots_of(self, lane: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """Flat slots of lane positions (broadcasting)."""
        T, C = self.T, self.C
        if T == 1:
            return (pos * self.lanes + lane) % C if self.lanes != 1 else pos % C
        w = pos // T
        n = w * self.lanes + lane
        return (n % C) * T + (pos - w * T)

    def positions_of(self, slots: np.ndarray) -> np.ndarray:
        """Lane positions of flat ``slots`` (which must hold live steps)."""
        T, C = self.T, self.C
        c = slots // T
        t = slots - c * T
        if self.mode == MODE_ISOLATED:
            return t
        last = self.n_end - 1
        n = last - ((last - c) % C)
        return (n // self.lanes) * T + t


def _slot_records(n_slots: int) -> np.ndarray:
    """The record of each of ``n_slots`` slots, ``-1`` (none) for now."""
    return np.full(n_slots, -1, dtype=slot_dtype(n_slots))


def _newest_written_slot(storage: Any, lanes: int) -> int | None:
    """The flat slot its writer wrote last (``None``: not recorded): the last lane of the
    storage's :attr:`~tdreplay.core.Storage.last_written_row`, a row of ``lanes`` slots (one
    per environment of a time-major storage; ``1`` for a flat one)."""
    row = storage.last_written_row
    return None if row is None else (int(row) + 1) * lanes - 1


def _geometry(storage: Any) -> tuple[int, int, bool, int, int]:
    """``(T, C, multi, lanes, len)``: steps per chunk, chunks, environment-major chunks,
    lanes of a flat ring and written slots.

    A storage with ``ndim > 1`` is time-major (TorchRL's layout): a ring of ``rows`` steps
    with one lane per slot of a row, ``C = rows * lanes`` chunks of one step.
    """
    length = len(storage)
    shape = getattr(storage, "shape", None)
    ndim = getattr(storage, "ndim", 1)
    if ndim > 1 and shape is not None and len(shape) >= 2:
        lanes = int(np.prod(shape[1:], dtype=np.int64))
        return 1, int(storage.rows_capacity) * lanes, False, lanes, length
    rows = storage.rows_capacity
    if rows is None:
        rows = storage.max_size
    return 1, int(rows), False, 1, length
