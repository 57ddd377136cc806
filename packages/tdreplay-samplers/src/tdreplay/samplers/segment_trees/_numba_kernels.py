"""numba kernels of the CPU segment trees: pure functions over a tree's flat node array.

Every kernel takes the flat float64 node array of a :class:`~.TreeLayout` tree (``nodes``), its
int64 level offsets (``offsets``) and C-contiguous int64 / float64 inputs; each is called with
one fixed signature, so it compiles once, on first use, and is then loaded from numba's disk
cache (:func:`~tdreplay.samplers._kernel_cache.on_disk`). They are the one
implementation of the numba trees' ``update``, ``rebuild`` and ``scan_lower_bound`` and are
reused by the prioritized sampler's fused kernels (:mod:`tdreplay.samplers._priority_numba`).

The kernels hold no state and check nothing: the tree classes (:mod:`._numba`) validate inputs.
``update`` writes the leaves in batch order (the last duplicate wins) and then recomputes the
ancestors from their 8 children one level at a time for the whole batch, dropping the items
whose recomputed node is unchanged (their ancestors are then already consistent). ``scan``
descends groups of masses level by level inside one kernel call (no Python loop over the batch)
and prefetches each mass's next block, so the cache misses of a large tree overlap instead of
adding up. ``refresh_min_over_sum`` / ``rebuild_min_over_sum`` keep the internal nodes of a min
tree whose leaf level is a sum tree's (:class:`~._numba.NumbaMinOverSumTree`): its bottom
nodes are the least positive values of their 8 sum-tree leaves.

``update_part``, ``refresh_over_sum`` and ``rebuild_levels`` (inlined into the kernels that call
them) do the same on part of a tree: the nodes below a range ``[lo, hi)`` of nodes of level
``stop``, up to that level. Threads that own disjoint ranges of one level can update a tree at
once (:mod:`tdreplay.samplers._priority_split`); the levels above ``stop`` are then rebuilt.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from .._kernel_cache import on_disk

__all__ = ["prefetch", "rebuild_levels", "rebuild_min", "rebuild_min_over_sum", "rebuild_sum",
           "refresh_min_over_sum", "refresh_over_sum", "scan", "update_min", "update_part",
           "update_sum"]

# ---------------------------------------------------------------------------------------------
# kernels
# ---------------------------------------------------------------------------------------------
@njit(nogil=True, inline="always")
def _block_sum(tree, b):  # pragma: no cover - compiled
    """The sum of the block ``tree[b : b + 8]``, in the fixed pairwise order of both backends."""
    return ((_at(tree, b) + _at(tree, b + 1)) + (_at(tree, b + 2) + _at(tree, b + 3))) + (
        (_at(tree, b + 4) + _at(tree, b + 5)) + (_at(tree, b + 6) + _at(tree, b + 7)))


@njit(nogil=True, inline="always")
def _lesser(a, b):  # pragma: no cover - compiled
    return a if a < b else b


@njit(nogil=True, inline="always")
def _block_min(tree, b):  # pragma: no cover - compiled
    """The minimum of the block ``tree[b : b + 8]``, reduced pairwise (three dependent steps,
    not seven; the minimum of non-NaN values does not depend on the order)."""
    return _lesser(
        _lesser(_lesser(_at(tree, b), _at(tree, b + 1)),
                _lesser(_at(tree, b + 2), _at(tree, b + 3))),
        _lesser(_lesser(_at(tree, b + 4), _at(tree, b + 5)),
                _lesser(_at(tree, b + 6), _at(tree, b + 7))))


#: Masses descended together by :func:`scan`: independent descents interleaved level by level
#: keep several cache misses in flight (the deep levels of a large tree miss in cache).
_SCAN_GROUP = 128


def _item_pointer(context: Any, builder: Any, signature: Any, args: Any) -> Any:
    """The address of ``array[index]`` (``args[:2]``), without numba's wraparound of negative
    indices (a compare and a select per access)."""
    arrayty = signature.args[0]
    ary = context.make_array(arrayty)(context, builder, args[0])
    return cgutils.get_item_pointer(context, builder, arrayty, ary, [args[1]], wraparound=False)


@intrinsic
def _at(typingctx, array, index):  # pragma: no cover - compiled
    """``array[index]`` for an ``index`` the kernel knows is in ``[0, len)`` (a node it computed
    from the tree's layout, a validated slot): one load. numba's own indexing adds a compare
    and a select per access for negative indices: a third of the descent's instructions."""

    def codegen(context, builder, signature, args):
        ptr = _item_pointer(context, builder, signature, args)
        return context.unpack_value(builder, signature.args[0].dtype, ptr)

    return array.dtype(array, index), codegen


@intrinsic
def _put(typingctx, array, index, value):  # pragma: no cover - compiled
    """``array[index] = value`` for an ``index`` in ``[0, len)`` (see :func:`_at`)."""

    def codegen(context, builder, signature, args):
        dtype = signature.args[0].dtype
        ptr = _item_pointer(context, builder, signature, args)
        value = context.cast(builder, args[2], signature.args[2], dtype)
        context.pack_value(builder, dtype, value, ptr)
        return context.get_dummy_value()

    return types.void(array, index, value), codegen


@intrinsic
def prefetch(typingctx, array, index):  # pragma: no cover - compiled
    """Hint the CPU to load ``array[index]`` into cache (``llvm.prefetch``; no effect on values)."""

    def codegen(context, builder, signature, args):
        ptr = _item_pointer(context, builder, signature, args)
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32, i32])
        fn = builder.module.declare_intrinsic("llvm.prefetch", [ptr.type], fnty)
        builder.call(fn, [ptr, i32(0), i32(3), i32(1)])  # read, high locality, data cache
        return context.get_dummy_value()

    return types.void(array, index), codegen


#: How many indices ahead :func:`update_part` (and :func:`_propagate`) prefetch the leaf
#: (the parent) they will write, so that the misses of the next writes overlap with the
#: current one.
_UPDATE_PREFETCH = 8


@njit(nogil=True, inline="always")
def _block_reduce(tree, b, is_min):  # pragma: no cover - compiled
    return _block_min(tree, b) if is_min else _block_sum(tree, b)


@njit(nogil=True, inline="always")
def _level_blocks(tree, offsets, level):  # pragma: no cover - compiled
    """Number of nodes of ``level`` that have children (blocks in level ``level + 1``)."""
    depth = offsets.shape[0] - 1
    end = tree.shape[0] if level + 1 == depth else offsets[level + 2]
    return (end - offsets[level + 1]) // 8


@njit(nogil=True, inline="always")
def _level_range(tree, offsets, level, stop, lo, hi):  # pragma: no cover - compiled
    """The nodes ``[a, b)`` of ``level`` that have children and lie below the nodes ``[lo, hi)``
    of level ``stop <= level``: all of them for ``(stop, lo, hi) = (0, 0, 1)`` (the root)."""
    shift = 3 * (level - stop)
    return lo << shift, min(hi << shift, _level_blocks(tree, offsets, level))


@njit(nogil=True, inline="always")
def rebuild_levels(tree, offsets, level, is_min, stop, lo, hi):  # pragma: no cover - compiled
    """Recompute the nodes of ``level`` and of the levels above it, up to level ``stop``, from
    their children: those below the nodes ``[lo, hi)`` of level ``stop`` (``(0, 0, 1)``: all)."""
    for lv in range(level, stop - 1, -1):
        children = offsets[lv + 1]
        start = offsets[lv]
        first, end = _level_range(tree, offsets, lv, stop, lo, hi)
        for node in range(first, end):
            _put(tree, start + node, _block_reduce(tree, children + 8 * node, is_min))


@njit(nogil=True, inline="always")
def _propagate(tree, offsets, nodes, live, top, is_min, stop, lo,
               hi):  # pragma: no cover - compiled
    """Recompute the nodes ``nodes[:live]`` of level ``top`` from their children, then their
    ancestors up to level ``stop``, one level at a time for the whole batch: the items of a
    level are independent, so their loads overlap (a walk to the root per item would chain
    every load on the previous store). An item whose recomputed node is unchanged is dropped
    (its ancestors are consistent; a duplicate parent is recomputed once, by the first item that
    reaches it). Once a level has no more nodes than items still going up, that level and those
    above are recomputed whole. ``nodes`` is overwritten. The nodes are all below the nodes
    ``[lo, hi)`` of level ``stop``, and only those are recomputed (``(0, 0, 1)``: up to the
    root; a thread that owns a subtree range stops below the levels other threads share)."""
    for level in range(top, stop - 1, -1):
        if live == 0:
            return
        first, end = _level_range(tree, offsets, level, stop, lo, hi)
        if end - first <= live:
            rebuild_levels(tree, offsets, level, is_min, stop, lo, hi)
            return
        children = offsets[level + 1]
        start = offsets[level]
        kept = 0
        for i in range(live):
            if i + _UPDATE_PREFETCH < live:  # the parents ahead: their misses overlap
                prefetch(tree, start + _at(nodes, i + _UPDATE_PREFETCH))
            node = _at(nodes, i)
            new = _block_reduce(tree, children + 8 * node, is_min)
            changed = new != _at(tree, start + node)
            _put(tree, start + node, new)  # unchanged: the same value again
            _put(nodes, kept, node >> 3)  # kept only if changed: overwritten otherwise
            kept += changed
        live = kept


@njit(nogil=True, inline="always")
def update_part(tree, offsets, index, values, is_min, stop, lo, hi):  # pragma: no cover - compiled
    # leaves first, in batch order (the last duplicate wins); then their ancestors up to level
    # ``stop`` (below its nodes [lo, hi), which hold every leaf of ``index``)
    depth = offsets.shape[0] - 1
    leaves = offsets[depth]
    n = index.shape[0]
    for i in range(n):
        if i + _UPDATE_PREFETCH < n:
            prefetch(tree, leaves + index[i + _UPDATE_PREFETCH])
        tree[leaves + index[i]] = values[i]
    nodes = np.empty(n, dtype=np.int64)
    for i in range(n):
        nodes[i] = index[i] >> 3
    _propagate(tree, offsets, nodes, n, depth - 1, is_min, stop, lo, hi)


# entry points: one compiled kernel each (a bool argument would be compiled once per value)
@on_disk
@njit(nogil=True)
def update_sum(tree, offsets, index, values):  # pragma: no cover - compiled
    update_part(tree, offsets, index, values, False, 0, 0, 1)


@on_disk
@njit(nogil=True)
def update_min(tree, offsets, index, values):  # pragma: no cover - compiled
    update_part(tree, offsets, index, values, True, 0, 0, 1)


@on_disk
@njit(nogil=True)
def rebuild_sum(tree, offsets):  # pragma: no cover - compiled
    rebuild_levels(tree, offsets, offsets.shape[0] - 2, False, 0, 0, 1)


@on_disk
@njit(nogil=True)
def rebuild_min(tree, offsets):  # pragma: no cover - compiled
    rebuild_levels(tree, offsets, offsets.shape[0] - 2, True, 0, 0, 1)


# the min over a sum tree's positive leaves (:class:`~._numba.NumbaMinOverSumTree`): ``min_nodes``
# holds levels 0 .. depth - 1 of the layout (no leaf level); the nodes of level depth - 1 are
# the minima of the positive values in their blocks of the sum tree's leaves
@njit(nogil=True, inline="always")
def _positive(v):  # pragma: no cover - compiled
    """``v`` if it is positive, else ``+inf`` (an empty leaf is no candidate for the minimum)."""
    return v if v > 0.0 else np.inf


@njit(nogil=True, inline="always")
def _positive_block_min(leaves, b):  # pragma: no cover - compiled
    """The least positive value of the block ``leaves[b : b + 8]`` (``+inf`` if none), reduced
    pairwise (three dependent steps, not seven; the minimum does not depend on the order)."""
    return _lesser(
        _lesser(_lesser(_positive(_at(leaves, b)), _positive(_at(leaves, b + 1))),
                _lesser(_positive(_at(leaves, b + 2)), _positive(_at(leaves, b + 3)))),
        _lesser(_lesser(_positive(_at(leaves, b + 4)), _positive(_at(leaves, b + 5))),
                _lesser(_positive(_at(leaves, b + 6)), _positive(_at(leaves, b + 7)))))


@njit(nogil=True, inline="always")
def _rebuild_over_sum(min_nodes, sum_nodes, offsets, stop, lo, hi):  # pragma: no cover - compiled
    """Recompute the min nodes below the nodes ``[lo, hi)`` of level ``stop`` (``(0, 0, 1)``:
    all of them) from the sum tree's leaves."""
    depth = offsets.shape[0] - 1
    leaves = offsets[depth]
    start = offsets[depth - 1]
    first, end = _level_range(sum_nodes, offsets, depth - 1, stop, lo, hi)
    for node in range(first, end):
        _put(min_nodes, start + node, _positive_block_min(sum_nodes, leaves + 8 * node))
    if depth > 1:
        rebuild_levels(min_nodes, offsets, depth - 2, True, stop, lo, hi)


@on_disk
@njit(nogil=True)
def rebuild_min_over_sum(min_nodes, sum_nodes, offsets):  # pragma: no cover - compiled
    _rebuild_over_sum(min_nodes, sum_nodes, offsets, 0, 0, 1)


@njit(nogil=True, inline="always")
def refresh_over_sum(min_nodes, sum_nodes, offsets, index, stop, lo,
                     hi):  # pragma: no cover - compiled
    """Recompute the min nodes above the sum tree's leaves ``index`` (after they changed), up
    to level ``stop``: the leaves are below its nodes ``[lo, hi)``, and only the min nodes below
    those are recomputed (see :func:`_propagate`)."""
    depth = offsets.shape[0] - 1
    leaves = offsets[depth]
    bottom = offsets[depth - 1]
    n = index.shape[0]
    if n == 0:
        return
    first, end = _level_range(sum_nodes, offsets, depth - 1, stop, lo, hi)
    if end - first <= n:
        _rebuild_over_sum(min_nodes, sum_nodes, offsets, stop, lo, hi)
        return
    nodes = np.empty(n, dtype=np.int64)
    kept = 0
    for i in range(n):
        if i + _UPDATE_PREFETCH < n:
            prefetch(min_nodes, bottom + (index[i + _UPDATE_PREFETCH] >> 3))
        node = index[i] >> 3
        new = _positive_block_min(sum_nodes, leaves + 8 * node)
        changed = new != _at(min_nodes, bottom + node)
        _put(min_nodes, bottom + node, new)  # as in _propagate: no branch on the comparison
        _put(nodes, kept, node >> 3)
        kept += changed
    _propagate(min_nodes, offsets, nodes, kept, depth - 2, True, stop, lo, hi)


@on_disk
@njit(nogil=True)
def refresh_min_over_sum(min_nodes, sum_nodes, offsets, index):  # pragma: no cover - compiled
    """Recompute the min nodes above the sum tree's leaves ``index`` (after they changed)."""
    refresh_over_sum(min_nodes, sum_nodes, offsets, index, 0, 0, 1)


@intrinsic
def _below(typingctx, x):  # pragma: no cover - compiled
    """``nextafter(x, -inf)`` for ``x > 0``: the float whose bit pattern is one less.

    Used only where ``x > 0`` (the descent's right children), where it equals ``np.nextafter``
    and ``torch.nextafter`` bit for bit, without a libm call.
    """

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        bits = builder.bitcast(args[0], i64)
        return builder.bitcast(builder.sub(bits, i64(1)), ir.DoubleType())

    return types.float64(types.float64), codegen


@njit(nogil=True, inline="always")
def _step(m, left, right, picked):  # pragma: no cover - compiled
    """One binary step of the descent: ``(m - left clamped below right, True)`` if
    ``m >= left`` (go right), else ``(m, False)``.

    The new mass is read back from ``picked`` at the index the comparison gives, not chosen by
    ``if``: LLVM compiles a conditional expression, even an explicit ``select``, into a branch
    here, and a random draw's branches are mispredicted half the time (measured: the descent of
    256 draws took 3x as long, 34 µs instead of 11 µs on a 4,096-slot tree).
    """
    go = m >= left
    _put(picked, 0, m)
    _put(picked, 1, min(m - left, _below(right)))
    return _at(picked, np.int64(go)), go


@on_disk
@njit(nogil=True)
def scan(tree, offsets, masses, out):  # pragma: no cover - compiled
    # The same clamped descent as the torch backend (bit-identical results). Within a block of
    # 8 children, the descent is binary over the pairwise sums the block's parent is made of
    # (halves, then pairs, then single children): at each step go right if m >= left, and then
    # m = min(m - left, nextafter(right, -inf)). m starts in [0, nextafter(total, -inf)], so
    # m < value(node) holds at every step: right > 0 whenever the descent goes right, and the
    # leaf reached has a positive value and an index < capacity.
    depth = offsets.shape[0] - 1
    hi = np.nextafter(tree[offsets[0]], -np.inf)
    n = masses.shape[0]
    ms = np.empty(_SCAN_GROUP, dtype=np.float64)
    nodes = np.empty(_SCAN_GROUP, dtype=np.int64)
    pairs = np.empty(4 * _SCAN_GROUP, dtype=np.float64)
    picked = np.empty(2, dtype=np.float64)
    for first in range(0, n, _SCAN_GROUP):
        g = min(_SCAN_GROUP, n - first)
        for j in range(g):
            m = masses[first + j]
            if not m >= 0.0:  # negative or NaN
                m = 0.0
            if m > hi:
                m = hi
            ms[j] = m
            nodes[j] = 0
        for level in range(1, depth + 1):  # one tree level per pass, for the whole group
            base = offsets[level]
            for j in range(g):
                # branch-free steps: the sides and the masses are picked by indexing (pairs /
                # tree / picked, see _step), since a mispredicted branch would flush the loads
                # in flight. Then prefetch the block of the next level: it is read one pass
                # later, after the rest of the group, so the miss overlaps with that work.
                m = _at(ms, j)
                b = base + 8 * _at(nodes, j)
                q = 4 * j
                _put(pairs, q, _at(tree, b) + _at(tree, b + 1))
                _put(pairs, q + 1, _at(tree, b + 2) + _at(tree, b + 3))
                _put(pairs, q + 2, _at(tree, b + 4) + _at(tree, b + 5))
                _put(pairs, q + 3, _at(tree, b + 6) + _at(tree, b + 7))
                left = _at(pairs, q) + _at(pairs, q + 1)
                right = _at(pairs, q + 2) + _at(pairs, q + 3)
                m, go = _step(m, left, right, picked)
                half = 2 * go
                left = _at(pairs, q + half)
                right = _at(pairs, q + half + 1)
                m, go = _step(m, left, right, picked)
                child = 2 * half + 2 * go
                left = _at(tree, b + child)
                right = _at(tree, b + child + 1)
                m, go = _step(m, left, right, picked)
                node = 8 * _at(nodes, j) + child + go
                _put(nodes, j, node)
                _put(ms, j, m)
                if level < depth:
                    prefetch(tree, offsets[level + 1] + 8 * node)
        for j in range(g):
            out[first + j] = nodes[j]
