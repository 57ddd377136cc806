"""CPU segment trees: float64 numpy arrays updated and searched by numba kernels.

The kernels are module-level ``@njit`` functions called with one fixed signature (C-contiguous
float64 tree, int64 indices, float64 values), so each compiles once per process on first use.
Inputs are converted to that signature before the call.

``update`` walks each index of the batch up to the root, recomputing every ancestor from its two
children, and stops early when a recomputed node is unchanged (its ancestors are then already
consistent); duplicates are applied in batch order, so the last one wins. ``scan`` descends
groups of masses level by level inside one kernel call (no Python loop over the batch), with a
branch-free step that prefetches the next level's nodes, so the cache misses of a large tree
overlap instead of adding up.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from ._base import MinSegmentTree, SegmentTree, SumSegmentTree, _check_capacity, _tree_shape

__all__ = ["NumbaMinTree", "NumbaSumTree"]


# ---------------------------------------------------------------------------------------------
# kernels
# ---------------------------------------------------------------------------------------------
@njit(cache=False, nogil=True)
def _update_sum(tree, p, index, values):  # pragma: no cover - compiled
    for i in range(index.shape[0]):
        pos = p + index[i]
        tree[pos] = values[i]
        pos >>= 1
        while pos >= 1:
            new = tree[2 * pos] + tree[2 * pos + 1]
            if new == tree[pos]:
                # unchanged node: its ancestors are already consistent
                break
            tree[pos] = new
            pos >>= 1


@njit(cache=False, nogil=True)
def _update_min(tree, p, index, values):  # pragma: no cover - compiled
    for i in range(index.shape[0]):
        pos = p + index[i]
        tree[pos] = values[i]
        pos >>= 1
        while pos >= 1:
            left = tree[2 * pos]
            right = tree[2 * pos + 1]
            new = left if left <= right else right
            if new == tree[pos]:
                break
            tree[pos] = new
            pos >>= 1


@njit(cache=False, nogil=True)
def _query(tree, p, start, end, is_min):  # pragma: no cover - compiled
    res = np.inf if is_min else 0.0
    lo = start + p
    hi = end + p
    while lo < hi:
        if lo & 1:
            v = tree[lo]
            if is_min:
                res = v if v < res else res
            else:
                res = res + v
            lo += 1
        if hi & 1:
            hi -= 1
            v = tree[hi]
            if is_min:
                res = v if v < res else res
            else:
                res = res + v
        lo >>= 1
        hi >>= 1
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


@njit(cache=False, nogil=True)
def _scan(tree, p, masses, out):  # pragma: no cover - compiled
    # The same clamped descent as the torch backend (bit-identical results):
    # m in [0, nextafter(total, -inf)], and when going right m <= nextafter(right, -inf), so
    # m < value(node) holds at every node and the leaf reached has a positive value.
    hi = np.nextafter(tree[1], -np.inf)
    n = masses.shape[0]
    ms = np.empty(_SCAN_GROUP, dtype=np.float64)
    nodes = np.empty(_SCAN_GROUP, dtype=np.int64)
    for first in range(0, n, _SCAN_GROUP):
        g = min(_SCAN_GROUP, n - first)
        for j in range(g):
            m = masses[first + j]
            if not m >= 0.0:  # negative or NaN
                m = 0.0
            if m > hi:
                m = hi
            ms[j] = m
            nodes[j] = 1
        width = p
        while width > 1:  # one tree level per pass, for the whole group
            for j in range(g):
                # branch-free step (a mispredicted branch would flush the loads in flight),
                # then prefetch the children of the next node: they are read one pass later,
                # after the rest of the group, so the miss overlaps with that work
                node = nodes[j]
                m = ms[j]
                left = tree[2 * node]
                right_m = min(m - left, np.nextafter(tree[2 * node + 1], -np.inf))
                go_right = m >= left
                node = 2 * node + go_right
                nodes[j] = node
                ms[j] = right_m if go_right else m
                if node < p:
                    _prefetch(tree, 2 * node)
            width >>= 1
        for j in range(g):
            out[first + j] = nodes[j] - p


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
        self.capacity = _check_capacity(capacity)
        self.device = torch.device("cpu")
        self._p, self._depth = _tree_shape(self.capacity)
        self._tree = np.full(2 * self._p, self.identity, dtype=np.float64)

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
            self._kernel_update(self._tree, self._p, idx, vals)

    def get(self, index: Any) -> np.ndarray | float:
        """Return the leaf values at ``index`` (a float for a scalar index)."""
        arr = _as_numpy(index)
        idx = self._index(arr)
        out = self._tree[self._p + idx]
        if arr.ndim == 0:
            return float(out[0])
        return out.reshape(arr.shape)

    def query(self, start: int = 0, end: int | None = None) -> float:
        """Return the reduction of leaves ``start .. end - 1`` (identity if empty), as a float."""
        start, end = self._check_range(start, end)
        if start == 0 and end == self.capacity:
            return float(self._tree[1])
        return float(_query(self._tree, self._p, start, end, self.kind == "min"))

    def rebuild(self) -> None:
        """Recompute every internal node from the leaves (O(capacity))."""
        tree = self._tree
        for level in range(self._depth - 1, -1, -1):
            lo, hi = 1 << level, 2 << level
            left = tree[2 * lo : 2 * hi : 2]
            right = tree[2 * lo + 1 : 2 * hi : 2]
            if self.kind == "sum":
                np.add(left, right, out=tree[lo:hi])
            else:
                np.minimum(left, right, out=tree[lo:hi])

    def _leaves_cpu(self) -> torch.Tensor:
        return torch.from_numpy(self._tree[self._p : self._p + self.capacity].copy())

    def _set_leaves(self, values: torch.Tensor) -> None:
        self._tree[self._p : self._p + self.capacity] = values.numpy()


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

    def total(self) -> float:
        """Return the sum of all leaves."""
        return float(self._tree[1])

    def scan_lower_bound(self, mass: Any) -> np.ndarray | int:
        """Batched prefix-sum search; see :meth:`SumSegmentTree.scan_lower_bound`.

        Returns int64 leaf indices with the shape of ``mass`` (an int for a scalar).

        Raises
        ------
        ValueError
            If the tree is empty (``total() <= 0``): no leaf can be sampled.
        """
        arr = _as_numpy(mass)
        if not self._tree[1] > 0.0:
            raise ValueError(
                f"scan_lower_bound needs a tree with a positive total, got total={self._tree[1]}"
            )
        flat = np.ascontiguousarray(arr.reshape(-1), dtype=np.float64)
        out = np.empty(flat.shape[0], dtype=np.int64)
        _scan(self._tree, self._p, flat, out)
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

    def min(self) -> float:
        """Return the minimum over all leaves."""
        return float(self._tree[1])
