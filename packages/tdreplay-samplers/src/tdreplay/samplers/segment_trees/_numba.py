"""CPU segment trees: float64 numpy arrays updated and searched by numba kernels.

The kernels (:mod:`._numba_kernels`) are module-level ``@njit`` functions called with one fixed
signature (C-contiguous float64 tree, int64 level offsets and indices, float64 values), so each
compiles once, on first use, and is then kept on disk (:mod:`.._kernel_cache`). Inputs are
converted to that signature before the call.

The trees use the 8-ary :class:`~._layout.TreeLayout`: the 8 children of a node fill one 64-byte
cache line (the arrays are 64-byte aligned), so a descent or an update touches one line per
level.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from tdreplay.core.utils import check_flag, restore_attributes

from ._base import MinOverSumTree, MinTree, SegmentTree, SumTree, index_error
from ._memory import host_array
from ._numba_kernels import (
    rebuild_min,
    rebuild_min_over_sum,
    rebuild_sum,
    refresh_min_over_sum,
    scan,
    update_min,
    update_sum,
)

__all__ = ["NumbaMinOverSumTree", "NumbaMinTree", "NumbaSumTree"]


def _aligned_array(size: int, value: float) -> np.ndarray:
    """A float64 array of ``size`` copies of ``value`` starting on a 64-byte boundary, and on a
    2 MiB boundary advised as huge pages when it spans one (:func:`~._memory.host_array`)."""
    return host_array(size, np.float64, value)


# ---------------------------------------------------------------------------------------------
# trees
# ---------------------------------------------------------------------------------------------
def _realigned(nodes: np.ndarray) -> np.ndarray:
    """A copy of ``nodes`` on a cache-line boundary (an unpickled array may start anywhere)."""
    aligned = _aligned_array(nodes.shape[0], 0.0)
    aligned[:] = nodes
    return aligned


def _as_numpy(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def _flat_index(index: Any, capacity: int) -> np.ndarray:
    """``index`` as a flat C-contiguous int64 array; ``TypeError`` unless it holds integers,
    ``IndexError`` unless they lie in ``[0, capacity)``."""
    arr = _as_numpy(index)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"index must hold integers, got dtype {arr.dtype}")
    flat = np.ascontiguousarray(arr.reshape(-1), dtype=np.int64)
    if flat.size:
        lo, hi = int(flat.min()), int(flat.max())
        if lo < 0 or hi >= capacity:
            raise index_error(capacity, lo, hi)
    return flat


class _NumbaTree(SegmentTree):
    backend = "numba"
    #: The numba kernels of the tree's reduction (set by the sum and min subclasses).
    _kernel_update: Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], None]
    _kernel_rebuild: Callable[[np.ndarray, np.ndarray], None]

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
        if check_flag(validate, "validate", allow_none=True) is False:
            raise ValueError("the numba backend always validates; validate=False is not supported")
        self._init_layout(capacity)
        self.device = torch.device("cpu")
        self._offsets = np.array(self._layout.offsets, dtype=np.int64)  # the kernels' view
        self._tree = _aligned_array(self._layout.size, self.identity)

    def __setstate__(self, state: dict[str, Any]) -> None:
        restore_attributes(self, state)
        self._tree = _realigned(self._tree)

    @property
    def nodes(self) -> np.ndarray:
        """The flat float64 node array (:class:`~._layout.TreeLayout`), for kernels working on
        the tree in place (e.g. :mod:`tdreplay.samplers._priority_numba`).

        Writing into it bypasses the checks of :meth:`update`; a kernel that changes leaves must
        recompute their ancestors (``_numba_kernels.update_sum`` / ``update_min`` do).

        Examples
        --------
        >>> tree = NumbaSumTree(3)
        >>> tree.update([1], [2.0])
        >>> float(tree.nodes[0]), float(tree.nodes[tree.layout.leaf_offset + 1])
        (2.0, 2.0)
        """
        return self._tree

    @property
    def offsets(self) -> np.ndarray:
        """Start of each level in :attr:`nodes`, root level first (int64: the kernels' view of
        ``layout.offsets``)."""
        return self._offsets

    # -- conversions --------------------------------------------------------------------------
    def _index(self, index: Any) -> np.ndarray:
        return _flat_index(index, self.capacity)

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
        """Set ``leaf[index[k]] = value[k]`` in O(B log C); see :class:`~._base.SumTree`.

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


class NumbaSumTree(_NumbaTree, SumTree):
    """CPU sum tree with numba kernels; see :class:`~._base.SumTree`.

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

    _kernel_update = staticmethod(update_sum)
    _kernel_rebuild = staticmethod(rebuild_sum)

    def total(self) -> float:
        """Return the sum of all leaves."""
        return float(self._tree[0])

    def scan_lower_bound(self, mass: Any) -> np.ndarray | int:
        """Batched prefix-sum search; see :meth:`~._base.SumTree.scan_lower_bound`.

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
        scan(self._tree, self._offsets, flat, out)
        if arr.ndim == 0:
            return int(out[0])
        return out.reshape(arr.shape)


class NumbaMinTree(_NumbaTree, MinTree):
    """CPU min tree with numba kernels; see :class:`~._base.MinTree`.

    Examples
    --------
    >>> tree = NumbaMinTree(3)
    >>> tree.update([0, 2], [4.0, 1.5])
    >>> tree.min(), tree.query(0, 2), tree.get(1)
    (1.5, 4.0, inf)
    """

    _kernel_update = staticmethod(update_min)
    _kernel_rebuild = staticmethod(rebuild_min)

    def min(self) -> float:
        """Return the minimum over all leaves."""
        return float(self._tree[0])


class NumbaMinOverSumTree(MinOverSumTree):
    """The least positive leaf of a :class:`NumbaSumTree`; see :class:`~._base.MinOverSumTree`.

    Examples
    --------
    >>> import numpy as np
    >>> sums = NumbaSumTree(20)
    >>> mins = NumbaMinOverSumTree(sums)
    >>> mins.min()
    inf
    >>> sums.update(np.array([3, 17]), np.array([2.0, 0.5]))
    >>> mins.refresh(np.array([3, 17]))
    >>> mins.min(), mins.nodes.size, sums.nodes.size  # no copy of the leaves
    (0.5, 16, 40)
    >>> sums.update(np.array([17]), np.array([0.0]))  # emptied: no longer a candidate
    >>> mins.refresh(np.array([17]))
    >>> mins.min()
    2.0
    """

    backend = "numba"

    def __init__(self, sum_tree: NumbaSumTree) -> None:
        super().__init__(sum_tree)
        self._sums = sum_tree  # typed as what it is
        self.device = torch.device("cpu")
        self._nodes = _aligned_array(self.layout.leaf_offset, np.inf)
        self.rebuild()

    def __setstate__(self, state: dict[str, Any]) -> None:
        restore_attributes(self, state)
        self._nodes = _realigned(self._nodes)

    @property
    def nodes(self) -> np.ndarray:
        """Levels ``0 .. depth - 1`` of the layout (for fused kernels working in place)."""
        return self._nodes

    def refresh(self, index: Any) -> None:
        """Recompute the nodes above the leaves ``index`` (integers in ``[0, capacity)``)."""
        idx = _flat_index(index, self.capacity)
        if idx.shape[0]:
            refresh_min_over_sum(self._nodes, self._sums.nodes, self._sums.offsets, idx)

    def rebuild(self) -> None:
        """Recompute every node from the sum tree's leaves (O(capacity))."""
        rebuild_min_over_sum(self._nodes, self._sums.nodes, self._sums.offsets)

    def min(self) -> float:
        """The least positive leaf of the sum tree (``inf`` if none)."""
        return float(self._nodes[0])
