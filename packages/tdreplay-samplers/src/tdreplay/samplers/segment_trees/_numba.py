"""CPU segment trees: float64 numpy arrays updated and searched by numba kernels.

The kernels are module-level ``@njit`` functions called with one fixed signature (C-contiguous
float64 tree, int64 level offsets and indices, float64 values), so each compiles once per
process on first use. Inputs are converted to that signature before the call.

The trees use the 8-ary :class:`~._base.TreeLayout`: the 8 children of a node fill one 64-byte
cache line (the arrays are 64-byte aligned), so a descent or an update touches one line per
level. ``update`` writes the leaves in batch order (the last duplicate wins) and then recomputes
the ancestors from their 8 children one level at a time for the whole batch, dropping the items
whose recomputed node is unchanged (their ancestors are then already consistent). ``scan``
descends groups of masses level by level inside one kernel call (no Python loop over the batch)
and prefetches each mass's next block, so the cache misses of a large tree overlap instead of
adding up.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from ._base import (
    MinSegmentTree,
    SegmentTree,
    SumSegmentTree,
)

__all__ = ["NumbaMinTree", "NumbaSumTree"]

#: Alignment of the node arrays: one block of 8 children per cache line.
_ALIGN_BYTES = 64
#: Arrays at least this large start on a 2 MiB boundary, so that the transparent huge pages
#: numpy asks for cover them whole: a descent to a random leaf then misses the TLB far less.
_HUGE_PAGE_BYTES = 2 << 20


# ---------------------------------------------------------------------------------------------
# kernels
# ---------------------------------------------------------------------------------------------
@njit(cache=False, nogil=True, inline="always")
def _block_sum(tree, b):  # pragma: no cover - compiled
    """The sum of the block ``tree[b : b + 8]``, in the fixed pairwise order of both backends."""
    return ((tree[b] + tree[b + 1]) + (tree[b + 2] + tree[b + 3])) + (
        (tree[b + 4] + tree[b + 5]) + (tree[b + 6] + tree[b + 7]))


@njit(cache=False, nogil=True, inline="always")
def _block_min(tree, b):  # pragma: no cover - compiled
    """The minimum of the block ``tree[b : b + 8]``."""
    res = tree[b]
    for c in range(1, 8):
        v = tree[b + c]
        res = v if v < res else res
    return res


#: Masses descended together by :func:`_scan`: independent descents interleaved level by level
#: keep several cache misses in flight (the deep levels of a large tree miss in cache).
_SCAN_GROUP = 128


@intrinsic
def _prefetch(typingctx, array, index):  # pragma: no cover - compiled
    """Hint the CPU to load ``array[index]`` into cache (``llvm.prefetch``; no effect on values)."""

    def codegen(context, builder, signature, args):
        arrayty = signature.args[0]
        ary = context.make_array(arrayty)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, arrayty, ary, [args[1]],
                                       wraparound=False)
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32, i32])
        fn = builder.module.declare_intrinsic("llvm.prefetch", [ptr.type], fnty)
        builder.call(fn, [ptr, i32(0), i32(3), i32(1)])  # read, high locality, data cache
        return context.get_dummy_value()

    return types.void(array, index), codegen


#: How many indices ahead :func:`_update` prefetches the leaf it will write, so that the
#: misses of the next writes overlap with the current one.
_UPDATE_PREFETCH = 8


@njit(cache=False, nogil=True, inline="always")
def _block_reduce(tree, b, is_min):  # pragma: no cover - compiled
    return _block_min(tree, b) if is_min else _block_sum(tree, b)


@njit(cache=False, nogil=True, inline="always")
def _level_blocks(tree, offsets, level):  # pragma: no cover - compiled
    """Number of nodes of ``level`` that have children (blocks in level ``level + 1``)."""
    depth = offsets.shape[0] - 1
    end = tree.shape[0] if level + 1 == depth else offsets[level + 2]
    return (end - offsets[level + 1]) // 8


@njit(cache=False, nogil=True, inline="always")
def _rebuild_from(tree, offsets, level, is_min):  # pragma: no cover - compiled
    """Recompute every node of ``level`` and of the levels above it from their children."""
    for lv in range(level, -1, -1):
        children = offsets[lv + 1]
        start = offsets[lv]
        for node in range(_level_blocks(tree, offsets, lv)):
            tree[start + node] = _block_reduce(tree, children + 8 * node, is_min)


@njit(cache=False, nogil=True, inline="always")
def _update(tree, offsets, index, values, is_min):  # pragma: no cover - compiled
    # Leaves first, in batch order (the last duplicate wins); then the ancestors one level at a
    # time for the whole batch: the items of a level are independent, so their loads overlap
    # (a walk to the root per item would chain every load on the previous store). An item whose
    # recomputed node is unchanged is dropped (its ancestors are consistent; a duplicate parent
    # is recomputed once, by the first item that reaches it). Once a level has no more nodes
    # than items still going up, that level and those above are recomputed whole.
    depth = offsets.shape[0] - 1
    leaves = offsets[depth]
    n = index.shape[0]
    for i in range(n):
        if i + _UPDATE_PREFETCH < n:
            _prefetch(tree, leaves + index[i + _UPDATE_PREFETCH])
        tree[leaves + index[i]] = values[i]
    nodes = np.empty(n, dtype=np.int64)
    for i in range(n):
        nodes[i] = index[i] >> 3
    live = n
    for level in range(depth - 1, -1, -1):
        if live == 0:
            return
        if (1 if level == 0 else offsets[level + 1] - offsets[level]) <= live:
            _rebuild_from(tree, offsets, level, is_min)
            return
        children = offsets[level + 1]
        start = offsets[level]
        kept = 0
        for i in range(live):
            node = nodes[i]
            new = _block_reduce(tree, children + 8 * node, is_min)
            if new != tree[start + node]:
                tree[start + node] = new
                nodes[kept] = node >> 3
                kept += 1
        live = kept


# entry points: one compiled kernel each (a bool argument would be compiled once per value)
@njit(cache=False, nogil=True)
def _update_sum(tree, offsets, index, values):  # pragma: no cover - compiled
    _update(tree, offsets, index, values, False)


@njit(cache=False, nogil=True)
def _update_min(tree, offsets, index, values):  # pragma: no cover - compiled
    _update(tree, offsets, index, values, True)


@njit(cache=False, nogil=True)
def _rebuild_sum(tree, offsets):  # pragma: no cover - compiled
    _rebuild_from(tree, offsets, offsets.shape[0] - 2, False)


@njit(cache=False, nogil=True)
def _rebuild_min(tree, offsets):  # pragma: no cover - compiled
    _rebuild_from(tree, offsets, offsets.shape[0] - 2, True)


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


@njit(cache=False, nogil=True)
def _scan(tree, offsets, masses, out):  # pragma: no cover - compiled
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
                # branch-free steps: the sides are picked by indexing (pairs / tree) and the
                # masses by selects, since a mispredicted branch would flush the loads in
                # flight. Then prefetch the block of the next level: it is read one pass later,
                # after the rest of the group, so the miss overlaps with that work.
                m = ms[j]
                b = base + 8 * nodes[j]
                q = 4 * j
                pairs[q] = tree[b] + tree[b + 1]
                pairs[q + 1] = tree[b + 2] + tree[b + 3]
                pairs[q + 2] = tree[b + 4] + tree[b + 5]
                pairs[q + 3] = tree[b + 6] + tree[b + 7]
                left = pairs[q] + pairs[q + 1]
                right = pairs[q + 2] + pairs[q + 3]
                go = m >= left
                step = min(m - left, _below(right))
                m = step if go else m
                half = 2 * go
                left = pairs[q + half]
                right = pairs[q + half + 1]
                go = m >= left
                step = min(m - left, _below(right))
                m = step if go else m
                child = 2 * half + 2 * go
                left = tree[b + child]
                right = tree[b + child + 1]
                go = m >= left
                step = min(m - left, _below(right))
                m = step if go else m
                node = 8 * nodes[j] + child + go
                nodes[j] = node
                ms[j] = m
                if level < depth:
                    _prefetch(tree, offsets[level + 1] + 8 * node)
        for j in range(g):
            out[first + j] = nodes[j]


def _aligned_array(size: int, value: float) -> np.ndarray:
    """A float64 array of ``size`` copies of ``value`` starting on a 64-byte boundary.

    Arrays of at least 2 MiB start on a 2 MiB boundary (huge pages; the extra address space is
    never touched).
    """
    align = _HUGE_PAGE_BYTES if size * 8 >= _HUGE_PAGE_BYTES else _ALIGN_BYTES
    buf = np.empty(size + align // 8, dtype=np.float64)
    start = (-buf.ctypes.data % align) // 8
    arr = buf[start : start + size]
    arr.fill(value)
    return arr


# ---------------------------------------------------------------------------------------------
# trees
# ---------------------------------------------------------------------------------------------
def _as_numpy(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)


class _NumbaTree(SegmentTree):
    backend = "numba"

    def __init__(
        self,
        capacity: int,
        *,
        backend: str | None = "numba",
        device: Any = None,
        validate: bool | None = None,
    ) -> None:
        if backend not in (None, "numba"):
            raise ValueError(f"backend must be 'numba' for {type(self).__name__}, got {backend!r}")
        if device is not None and torch.device(device).type != "cpu":
            raise ValueError(f"the numba backend runs on CPU only, got device={device!r}")
        if validate is False:
            raise ValueError("the numba backend always validates; validate=False is not supported")
        self._init_layout(capacity)
        self.device = torch.device("cpu")
        self._offsets = np.array(self._layout.offsets, dtype=np.int64)  # the kernels' view
        self._tree = _aligned_array(self._layout.size, self.identity)

    def __setstate__(self, state: dict[str, Any]) -> None:
        # an unpickled array may start anywhere: copy it back onto a cache-line boundary
        self.__dict__.update(state)
        tree = _aligned_array(self._tree.shape[0], 0.0)
        tree[:] = state["_tree"]
        self._tree = tree

    # -- conversions --------------------------------------------------------------------------
    def _index(self, index: Any) -> np.ndarray:
        arr = _as_numpy(index)
        if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(f"index must hold integers, got dtype {arr.dtype}")
        flat = np.ascontiguousarray(arr.reshape(-1), dtype=np.int64)
        if flat.size:
            lo, hi = int(flat.min()), int(flat.max())
            if lo < 0 or hi >= self.capacity:
                raise self._index_error(lo, hi)
        return flat

    def _values(self, value: Any, n: int, shape: tuple[int, ...]) -> np.ndarray:
        arr = _as_numpy(value)
        if arr.dtype == np.bool_ or not (
            np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)
        ):
            raise TypeError(f"value must hold real numbers, got dtype {arr.dtype}")
        if arr.ndim == 0:
            return np.full(n, float(arr), dtype=np.float64)
        if arr.size != n:
            raise ValueError(
                f"value must be a scalar or match index: index has shape {shape}, "
                f"value has shape {arr.shape}"
            )
        return np.ascontiguousarray(arr.reshape(-1), dtype=np.float64)

    # -- interface ----------------------------------------------------------------------------
    def to(self, device: Any) -> _NumbaTree:
        """Return ``self`` for a CPU device; the numba tree cannot move elsewhere."""
        if torch.device(device).type != "cpu":
            raise ValueError(
                f"the numba backend runs on CPU only, got device={device!r}; "
                "use backend='torch' for device trees"
            )
        return self

    def update(self, index: Any, value: Any) -> None:
        """Set ``leaf[index[k]] = value[k]`` in O(B log C); see :class:`SumSegmentTree`.

        ``index`` holds integers in ``[0, capacity)`` (any shape, flattened); ``value`` is a
        scalar or has as many elements. Duplicates are applied in order: the last one wins.
        """
        arr = _as_numpy(index)
        idx = self._index(arr)
        vals = self._values(value, idx.shape[0], arr.shape)
        if idx.shape[0]:
            self._kernel_update(self._tree, self._offsets, idx, vals)

    def get(self, index: Any) -> np.ndarray | float:
        """Return the leaf values at ``index`` (a float for a scalar index)."""
        arr = _as_numpy(index)
        idx = self._index(arr)
        out = self._tree[self._layout.leaf_offset + idx]
        if arr.ndim == 0:
            return float(out[0])
        return out.reshape(arr.shape)

    def query(self, start: int = 0, end: int | None = None) -> float:
        """Return the reduction of leaves ``start .. end - 1`` (identity if empty), as a float."""
        start, end = self._check_range(start, end)
        if start == 0 and end == self.capacity:
            return float(self._tree[0])
        values = self._tree[self._layout.query_positions(start, end)].tolist()
        res = self.identity
        for v in values:  # the order of the torch backend: identical sums
            res = (v if v < res else res) if self.kind == "min" else res + v
        return float(res)

    def rebuild(self) -> None:
        """Recompute every internal node from the leaves (O(capacity))."""
        self._kernel_rebuild(self._tree, self._offsets)

    def _leaves_cpu(self) -> torch.Tensor:
        return torch.from_numpy(self._tree[self._layout.leaves].copy())

    def _set_leaves(self, values: torch.Tensor) -> None:
        self._tree[self._layout.leaves] = values.numpy()


class NumbaSumTree(_NumbaTree, SumSegmentTree):
    """CPU sum tree with numba kernels; see :class:`SumSegmentTree`.

    Inputs may be numpy arrays, sequences or torch tensors; outputs are numpy arrays / floats.

    Examples
    --------
    >>> import numpy as np
    >>> tree = NumbaSumTree(3)
    >>> tree.update(np.array([0, 1, 1]), np.array([1.0, 9.0, 2.0]))  # last duplicate wins
    >>> tree[np.array([0, 1, 2])], tree.total()
    (array([1., 2., 0.]), 3.0)
    >>> tree.scan_lower_bound(np.array([0.0, 0.99, 1.0, 7.0]))
    array([0, 0, 1, 1])
    """

    _kernel_update = staticmethod(_update_sum)
    _kernel_rebuild = staticmethod(_rebuild_sum)

    def total(self) -> float:
        """Return the sum of all leaves."""
        return float(self._tree[0])

    def scan_lower_bound(self, mass: Any) -> np.ndarray | int:
        """Batched prefix-sum search; see :meth:`SumSegmentTree.scan_lower_bound`.

        Returns int64 leaf indices with the shape of ``mass`` (an int for a scalar).

        Raises
        ------
        ValueError
            If the tree is empty (``total() <= 0``): no leaf can be sampled.
        """
        arr = _as_numpy(mass)
        if not self._tree[0] > 0.0:
            raise ValueError(
                f"scan_lower_bound needs a tree with a positive total, got total={self._tree[0]}"
            )
        flat = np.ascontiguousarray(arr.reshape(-1), dtype=np.float64)
        out = np.empty(flat.shape[0], dtype=np.int64)
        _scan(self._tree, self._offsets, flat, out)
        if arr.ndim == 0:
            return int(out[0])
        return out.reshape(arr.shape)


class NumbaMinTree(_NumbaTree, MinSegmentTree):
    """CPU min tree with numba kernels; see :class:`MinSegmentTree`.

    Examples
    --------
    >>> tree = NumbaMinTree(3)
    >>> tree.update([0, 2], [4.0, 1.5])
    >>> tree.min(), tree.query(0, 2), tree.get(1)
    (1.5, 4.0, inf)
    """

    _kernel_update = staticmethod(_update_min)
    _kernel_rebuild = staticmethod(_rebuild_min)

    def min(self) -> float:
        """Return the minimum over all leaves."""
        return float(self._tree[0])
