"""Fused numba kernels of the prioritized sampler on numba trees (pure functions).

One sampler call is one kernel call: ``extend_kernel`` gives written slots their priority in
the sum, min (and max) trees; ``sample_kernel`` draws slots and returns their importance weights
and write generations; ``update_kernel`` checks a whole priority update and then applies it
(``check_values_kernel`` is its check of the values alone, run before the data is written when
priorities come with it); ``extend_prioritized_kernel`` is ``extend_kernel`` and then
``update_kernel`` in one pass, for slots written with their (checked) priorities.
They work on the flat node arrays the numba trees expose (``tree.nodes``, ``tree.offsets``)
and reuse the trees' own descent and update kernels (:mod:`.segment_trees._numba_kernels`), so
the results are exactly those of the tree methods; what they save is the Python overhead of
several checked tree calls per step, which dominates at small batch sizes.

They are kept on disk like the tree kernels. Since their compiled code holds the tree kernels'
code, :func:`fused_kernels` builds them as closures over the tree kernels' source fingerprint,
which numba's cache key includes: when the tree kernels change, the fused kernels compile again
instead of loading stale code (see :mod:`._kernel_cache`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import njit

from ._kernel_cache import on_disk, source_fingerprint
from .segment_trees import _numba_kernels as tree_kernels
from .segment_trees._numba_kernels import (
    _at,
    _put,
    prefetch,
    refresh_min_over_sum,
    scan,
    update_min,
    update_sum,
)

__all__ = ["BAD_PRIORITY", "INDEX_OUT_OF_RANGE", "OK", "UNWRITTEN_SLOT", "check_entries",
           "check_values_kernel", "draw_into", "extend_kernel", "extend_prioritized_kernel",
           "fused_kernels", "kept_entries", "sample_kernel", "sample_range_kernel", "update_kernel"]

#: ``update_kernel`` return codes (the offending position is returned with them).
OK, BAD_PRIORITY, INDEX_OUT_OF_RANGE, UNWRITTEN_SLOT = 0, 1, 2, 3
#: Smallest normal float64: the least stored priority (``_priority_values.TINY``).
_TINY = float(np.finfo(np.float64).tiny)


@njit(nogil=True, inline="always")
def _clamped(leaf):  # pragma: no cover - compiled
    """``leaf`` clamped to at least the smallest normal float64 (NaN stays NaN, as torch's
    ``clamp_min``)."""
    return _TINY if leaf < _TINY else leaf


@njit(nogil=True, inline="always")
def _first_bad_value(raw, leaf, leaf_max):  # pragma: no cover - compiled
    """Position of the first priority value an update refuses (``-1``: none): a raw value that is
    NaN, infinite or negative, else a stored value ``leaf`` (before the clamp to the smallest
    normal float64) above ``leaf_max`` (overflowed once raised to alpha)."""
    for k in range(raw.shape[0]):
        v = raw[k]
        if not (v >= 0.0 and v < np.inf):  # NaN fails too
            return k
    for k in range(leaf.shape[0]):
        if not _clamped(leaf[k]) <= leaf_max:
            return k
    return -1


@on_disk
@njit(nogil=True)
def check_values_kernel(raw, leaf, leaf_max):  # pragma: no cover - compiled
    """The check of ``update_kernel`` on priority values alone (no index, no write): the
    position of the first refused value, ``-1`` when every one is accepted (see
    :func:`_first_bad_value`)."""
    return _first_bad_value(raw, leaf, leaf_max)


@njit(nogil=True, inline="always")
def check_entries(capacity, n_written, gen, index, raw, leaf, leaf_max,
                  has_token):  # pragma: no cover - compiled
    """The checks of an update (see ``update_kernel``): ``(code, position)``, ``(OK, 0)`` when it
    may be applied. An update with write generations (``has_token``) may point at unwritten
    slots: those entries are stale (the storage was emptied or restored since the sample) and
    ``kept_entries`` leaves them out, as the entries of rewritten slots."""
    bad = _first_bad_value(raw, leaf, leaf_max)
    if bad >= 0:
        return BAD_PRIORITY, bad
    for i in range(index.shape[0]):
        slot = _at(index, i)
        if slot == -1:
            continue
        if slot < -1 or slot >= capacity:
            return INDEX_OUT_OF_RANGE, i
        if not has_token and (slot >= n_written or _at(gen, slot) == 0):  # (slot in range)
            return UNWRITTEN_SLOT, i
    return OK, 0


@njit(nogil=True, inline="always")
def kept_entries(gen, index, priority, leaf, token, has_token, first_slot, end_slot,
                 size):  # pragma: no cover - compiled
    """The entries of a checked update that are written, those of slots in ``[first_slot,
    end_slot)`` (``size`` of them at most): ``(kept, kept_leaf, kept_neg, k, top)``. The first
    ``k`` entries of ``kept`` are their slots (in batch order: ``-1`` entries and those whose
    generation is no longer ``token`` are left out), of ``kept_leaf`` their stored values
    (clamped) and of ``kept_neg`` their negated priorities (for the max tree); ``top`` is the
    largest priority (``-inf``: none)."""
    # Branch-free: every entry is written at position k, which moves on only for a kept one
    # (a part of a split update keeps about one entry in parts: a branch on it would be
    # mispredicted that often). Hence one spare position at the end.
    n = index.shape[0]
    kept = np.empty(size + 1, dtype=np.int64)
    kept_leaf = np.empty(size + 1, dtype=np.float64)
    kept_neg = np.empty(size + 1, dtype=np.float64)
    k = 0
    top = -np.inf
    for i in range(n):
        slot = _at(index, i)
        inside = (slot >= first_slot) & (slot < end_slot)
        if has_token:  # (the same for every entry: predicted)
            # the generation of a slot outside is not read: that of first_slot stands in
            inside &= _at(gen, slot if inside else first_slot) == _at(token, i)
        value = _at(priority, i)
        _put(kept, k, slot)
        _put(kept_leaf, k, _clamped(_at(leaf, i)))
        _put(kept_neg, k, -value)
        top = max(top, value if inside else -np.inf)
        k += inside
    return kept, kept_leaf, kept_neg, k, top


@njit(nogil=True, inline="always")
def draw_into(sum_nodes, offsets, u, first, count, stratified, gen, log_min, beta, out_index,
              out_weight, out_gen):  # pragma: no cover - compiled
    """Slots for the uniform draws ``u``, with their importance weights ``(p_i / p_min) **
    -beta`` (computed in log space, as the torch path: ``log_min`` is ``log(p_min)``) and
    write generations; returns the largest slot drawn (``-1`` for no draw).

    ``u`` are the draws ``first, first + 1, ...`` of a sample of ``count``. The masses are
    ``u * total`` (or ``(i + u_i) / count * total`` for draw ``i`` when stratified),
    computed with the same float64 operations as the torch path, so both backends draw the
    same slots.
    """
    n = u.shape[0]
    total = sum_nodes[0]
    leaves = offsets[offsets.shape[0] - 1]
    masses = np.empty(n, dtype=np.float64)
    for i in range(n):
        if stratified:
            _put(masses, i, (first + i + _at(u, i)) / count * total)
        else:
            _put(masses, i, _at(u, i) * total)
    scan(sum_nodes, offsets, masses, out_index)
    for i in range(n):  # the generations are read last: their lines load meanwhile
        prefetch(gen, _at(out_index, i))
    top = -1
    for i in range(n):
        slot = _at(out_index, i)
        _put(out_weight, i,
             math.exp((math.log(_at(sum_nodes, leaves + slot)) - log_min) * -beta))
        if slot > top:
            top = slot
    for i in range(n):
        _put(out_gen, i, _at(gen, _at(out_index, i)))
    return top


def fused_kernels(tree_kernels_version: int) -> tuple[Any, Any, Any, Any, Any]:
    """The fused kernels ``(extend_kernel, sample_kernel, update_kernel,
    extend_prioritized_kernel, sample_range_kernel)``, closing over
    ``tree_kernels_version`` (:func:`~._kernel_cache.source_fingerprint` of the tree kernels they
    call), which each names in its body so that numba's cache key holds it."""

    @on_disk
    @njit(nogil=True)
    def extend_kernel(sum_nodes, min_nodes, max_nodes, has_max, offsets, index,
                      leaf, gen, generation):  # pragma: no cover - compiled
        """Give the (checked) slots ``index`` the stored priority ``leaf`` in the sum tree (and the
        min over its leaves, ``min_nodes``) and the write generation ``generation`` in ``gen``;
        with ``has_max``, ``+inf`` in the max tree (no priority set by an update yet)."""
        _ = tree_kernels_version  # in the cache key
        for i in range(index.shape[0]):
            _put(gen, _at(index, i), generation)
        values = np.full(index.shape[0], leaf)
        update_sum(sum_nodes, offsets, index, values)
        refresh_min_over_sum(min_nodes, sum_nodes, offsets, index)
        if has_max:
            values.fill(np.inf)
            update_min(max_nodes, offsets, index, values)

    @on_disk
    @njit(nogil=True)
    def sample_kernel(sum_nodes, offsets, u, stratified, gen, log_min, beta, out_index,
                      out_weight, out_gen):  # pragma: no cover - compiled
        """The draws of a sample, all of them (see ``draw_into``)."""
        _ = tree_kernels_version  # in the cache key
        return draw_into(sum_nodes, offsets, u, 0, u.shape[0], stratified, gen, log_min, beta,
                         out_index, out_weight, out_gen)

    @on_disk
    @njit(nogil=True)
    def sample_range_kernel(sum_nodes, offsets, u, first, count, stratified, gen, log_min, beta,
                            out_index, out_weight, out_gen):  # pragma: no cover - compiled
        """The draws ``first ..`` of a sample of ``count`` (a sample split over threads is one
        call per range of its draws; see ``draw_into``)."""
        _ = tree_kernels_version  # in the cache key
        return draw_into(sum_nodes, offsets, u, first, count, stratified, gen, log_min, beta,
                         out_index, out_weight, out_gen)

    @on_disk
    @njit(nogil=True)
    def update_kernel(sum_nodes, min_nodes, max_nodes, has_max, offsets, capacity, n_written, gen,
                      index, raw, priority, leaf, leaf_max, token,
                      has_token):  # pragma: no cover - compiled
        """Check, then apply, a priority update; returns ``(code, position, top)``.

        ``raw`` holds every priority value given (trailing dims included), ``priority`` one reduced
        value per index and ``leaf`` its stored value before the clamp to the smallest normal
        float64 (``(priority + eps) ** alpha``, clamped here). Checks, before any write: every raw
        value is finite and ``>= 0``; every stored value is at most ``leaf_max``; every index is
        ``-1`` (skipped) or a written slot in ``[0, min(capacity, n_written))``. On failure nothing
        is written and ``code`` says why (``position`` is where). Otherwise the entries whose slot
        generation is still ``token`` (when ``has_token``) are written and ``top`` is their largest
        priority (``-inf`` if none).
        """
        _ = tree_kernels_version  # in the cache key
        code, position = check_entries(capacity, n_written, gen, index, raw, leaf, leaf_max,
                                       has_token)
        if code != OK:
            return code, position, -np.inf
        kept, kept_leaf, kept_neg, k, top = kept_entries(gen, index, priority, leaf, token,
                                                         has_token, 0, capacity, index.shape[0])
        update_sum(sum_nodes, offsets, kept[:k], kept_leaf[:k])
        refresh_min_over_sum(min_nodes, sum_nodes, offsets, kept[:k])
        if has_max:
            update_min(max_nodes, offsets, kept[:k], kept_neg[:k])
        return OK, 0, top

    @on_disk
    @njit(nogil=True)
    def extend_prioritized_kernel(sum_nodes, min_nodes, max_nodes, has_max, offsets, gen, index,
                                  priority, leaf, generation):  # pragma: no cover - compiled
        """``extend_kernel`` then ``update_kernel`` of the slots just written (in ``[0,
        capacity)``) with their checked priorities, in one pass: each slot gets the write
        generation ``generation`` and its priority (the last duplicate wins); returns the
        largest priority. The trees are those of the two calls, bit for bit."""
        _ = tree_kernels_version  # in the cache key
        n = index.shape[0]
        for i in range(n):
            _put(gen, _at(index, i), generation)
        kept, kept_leaf, kept_neg, k, top = kept_entries(gen, index, priority, leaf, index,
                                                         False, 0, gen.shape[0], n)
        update_sum(sum_nodes, offsets, kept[:k], kept_leaf[:k])
        refresh_min_over_sum(min_nodes, sum_nodes, offsets, kept[:k])
        if has_max:
            update_min(max_nodes, offsets, kept[:k], kept_neg[:k])
        return top

    return (extend_kernel, sample_kernel, update_kernel, extend_prioritized_kernel,
            sample_range_kernel)


(extend_kernel, sample_kernel, update_kernel, extend_prioritized_kernel,
 sample_range_kernel) = fused_kernels(source_fingerprint(tree_kernels))
