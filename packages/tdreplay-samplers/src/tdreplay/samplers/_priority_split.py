"""Prioritized draws and updates of a large batch on numba trees, split over threads.

A sample of 65,536 slots from a host tree is 65,536 independent descents, and an update of as
many priorities touches leaves all over the tree; one core does either in milliseconds, mostly
waiting on cache misses. The numba kernels release the GIL, so :mod:`._host_threads` can run
parts of one call in threads at once (as many as ``torch.get_num_threads()``, each part at least
:data:`~._host_threads.MIN_ITEMS_PER_THREAD` items):

- :func:`split_draw`: each thread descends a contiguous range of the draws (the draws and their
  masses are those of one call: a stratified draw ``i`` still falls in stratum ``i``);
- :func:`split_update`: the update is checked first, in the caller's thread (a refused update
  writes nothing). Then each thread owns a part of a :class:`SubtreeSplit`, a
  range of the nodes of one tree level and everything below them: it reads the whole batch,
  keeps the entries of its own slots, writes their leaves and recomputes their ancestors up to
  that level, in the sum, min and max trees. The few nodes above it are then rebuilt. Every
  node is recomputed from its children the way the one-call kernel does, so the trees are the
  same bit for bit (the tests compare them).

The kernels are cached on disk like the fused kernels (:mod:`._priority_numba`), keyed on the
source of the kernels they inline.

Examples
--------
>>> import numpy as np
>>> from tdreplay.samplers.segment_trees import TreeLayout
>>> offsets = np.asarray(TreeLayout(1_000_000).offsets)
>>> split = SubtreeSplit.plan(offsets, n_written=1_000_000, parts=4)
>>> split.stop, split.span, split.nodes, split.node_ranges()
(3, 4096, 245, [(0, 61), (61, 122), (122, 183), (183, 245)])
>>> SubtreeSplit.plan(offsets, n_written=100, parts=4) is None  # too few leaves to split
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import njit

from . import _priority_numba as fused
from ._host_threads import run_parts, thread_ranges
from ._kernel_cache import on_disk, source_fingerprint
from ._priority_numba import OK, check_entries, kept_entries
from .segment_trees import FANOUT
from .segment_trees import _numba_kernels as tree_kernels
from .segment_trees._numba_kernels import rebuild_levels, refresh_over_sum, update_part

__all__ = ["NODES_PER_PART", "SubtreeSplit", "check_kernel", "split_draw", "split_kernels",
           "split_update", "split_write", "update_part_kernel", "update_top_kernel"]

#: Fewest nodes of the split level per part: the parts' sizes differ by one node at most, so
#: their work differs by a sixteenth at most (the slots drawn or updated spread over the leaves).
NODES_PER_PART = 16


@dataclass(frozen=True)
class SubtreeSplit:
    """``parts`` ranges of the ``nodes`` nodes of level ``stop`` of a tree (those over the
    written slots; ``span`` leaves below each), each owned by one thread of an update."""

    stop: int
    span: int
    nodes: int
    parts: int

    @classmethod
    def plan(cls, offsets: np.ndarray, n_written: int, parts: int) -> SubtreeSplit | None:
        """The split of a tree with level ``offsets`` whose slots ``[0, n_written)`` are written
        into ``parts`` parts: at the highest level with :data:`NODES_PER_PART` nodes per part
        over the written slots (the levels above are rebuilt after the parts, so the higher,
        the less to rebuild); ``None`` when no level below the root's children has that many."""
        depth = len(offsets) - 1
        for stop in range(1, depth):
            span = FANOUT ** (depth - stop)
            nodes = -(-n_written // span)
            if nodes >= NODES_PER_PART * parts:
                return cls(stop, span, nodes, parts)
        return None

    def node_ranges(self) -> list[tuple[int, int]]:
        """The parts' nodes of level ``stop``: ``[(lo, hi), ...]``, part ``t`` from
        ``t * nodes // parts``."""
        return [(t * self.nodes // self.parts, (t + 1) * self.nodes // self.parts)
                for t in range(self.parts)]


def split_kernels(kernels_version: int) -> tuple[Any, Any, Any]:
    """``(check_kernel, update_part_kernel, update_top_kernel)``, closing over
    ``kernels_version`` (the source fingerprint of the kernels they inline), which each names in
    its body so that numba's cache key holds it."""

    @on_disk
    @njit(nogil=True)
    def check_kernel(capacity, n_written, gen, index, raw, leaf, leaf_max,
                     has_token):  # pragma: no cover - compiled
        """The checks of ``update_kernel``: ``OK`` or why not."""
        _ = kernels_version  # in the cache key
        return check_entries(capacity, n_written, gen, index, raw, leaf, leaf_max, has_token)[0]

    @on_disk
    @njit(nogil=True)
    def update_part_kernel(sum_nodes, min_nodes, max_nodes, has_max, offsets, gen, index,
                           priority, leaf, token, has_token, span, stop, lo,
                           hi):  # pragma: no cover - compiled
        """Write the entries of a checked update whose slots are below the nodes ``[lo, hi)`` of
        level ``stop`` (``span`` leaves each) into the sum, min (and max) trees, up to level
        ``stop``; returns their largest priority (``-inf``: none). Every part reads the whole
        batch (in order: the last duplicate still wins) and keeps its own slots."""
        _ = kernels_version  # in the cache key
        first_slot, end_slot = lo * span, hi * span
        size = 0  # the part's entries: its arrays are that long, not the batch's length
        for i in range(index.shape[0]):
            size += first_slot <= index[i] < end_slot
        kept, kept_leaf, kept_neg, k, top = kept_entries(gen, index, priority, leaf, token,
                                                         has_token, first_slot, end_slot, size)
        update_part(sum_nodes, offsets, kept[:k], kept_leaf[:k], False, stop, lo, hi)
        refresh_over_sum(min_nodes, sum_nodes, offsets, kept[:k], stop, lo, hi)
        if has_max:
            update_part(max_nodes, offsets, kept[:k], kept_neg[:k], True, stop, lo, hi)
        return top

    @on_disk
    @njit(nogil=True)
    def update_top_kernel(sum_nodes, min_nodes, max_nodes, has_max, offsets,
                          stop):  # pragma: no cover - compiled
        """Rebuild the levels above ``stop`` of the trees, once every part is written."""
        _ = kernels_version  # in the cache key
        rebuild_levels(sum_nodes, offsets, stop - 1, False, 0, 0, 1)
        rebuild_levels(min_nodes, offsets, stop - 1, True, 0, 0, 1)
        if has_max:
            rebuild_levels(max_nodes, offsets, stop - 1, True, 0, 0, 1)

    return check_kernel, update_part_kernel, update_top_kernel


check_kernel, update_part_kernel, update_top_kernel = split_kernels(
    source_fingerprint(tree_kernels, fused))


def split_draw(parts: int, sum_nodes: np.ndarray, offsets: np.ndarray, u: np.ndarray,
               stratified: bool, gen: np.ndarray, log_min: float, beta: float,
               out_index: np.ndarray, out_weight: np.ndarray, out_gen: np.ndarray) -> int:
    """``fused.sample_kernel`` over the draws ``u``, in ``parts`` threads (each a contiguous
    range of the draws and of the outputs); the largest slot drawn."""
    count = u.shape[0]

    def draw(start: int, stop: int) -> int:
        return fused.sample_range_kernel(sum_nodes, offsets, u[start:stop], start, count,
                                         stratified, gen, log_min, beta, out_index[start:stop],
                                         out_weight[start:stop], out_gen[start:stop])

    return max(run_parts(draw, thread_ranges(count, parts)))


def split_update(split: SubtreeSplit, trees: tuple[np.ndarray, np.ndarray, np.ndarray, bool],
                 offsets: np.ndarray, capacity: int, n_written: int, gen: np.ndarray,
                 entries: tuple[np.ndarray, ...], leaf_max: float, token: np.ndarray,
                 has_token: bool) -> tuple[int, float]:
    """``fused.update_kernel`` in the parts of ``split``: ``(code, top)``. ``trees`` are the
    sum, min and max node arrays and whether there is a max tree; ``entries`` the update's
    ``(index, raw, priority, leaf)`` arrays. A refused update (``code != OK``: why) writes
    nothing."""
    index, raw, priority, leaf = entries
    code = check_kernel(capacity, n_written, gen, index, raw, leaf, leaf_max, has_token)
    if code != OK:  # (checked in the caller's thread: a second hand-over would cost as much)
        return code, -np.inf
    return OK, split_write(split, trees, offsets, gen, (index, priority, leaf), token, has_token)


def split_write(split: SubtreeSplit, trees: tuple[np.ndarray, np.ndarray, np.ndarray, bool],
                offsets: np.ndarray, gen: np.ndarray, entries: tuple[np.ndarray, ...],
                token: np.ndarray, has_token: bool) -> float:
    """Write the checked ``(index, priority, leaf)`` entries into the trees in the parts of
    ``split`` (see :func:`split_update`); their largest priority."""
    index, priority, leaf = entries

    def write(lo: int, hi: int) -> float:
        return update_part_kernel(*trees, offsets, gen, index, priority, leaf, token, has_token,
                                  split.span, split.stop, lo, hi)

    top = max(run_parts(write, split.node_ranges()))
    update_top_kernel(*trees, offsets, split.stop)
    return top
