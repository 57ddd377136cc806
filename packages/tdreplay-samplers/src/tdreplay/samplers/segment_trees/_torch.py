"""Device segment trees: a flat float64 torch tensor updated and searched level by level.

The trees use the 8-ary :class:`~._layout.TreeLayout` and the arithmetic of the numba kernels:
each level is viewed as rows of 8 children, gathered with one ``index_select`` per level.
Every operation is a fixed number of tensor ops per tree level (O(log C) kernel launches for a
whole batch), with shapes that depend only on the batch size, so nothing waits on the device:
no ``.item()``, no data-dependent shapes, unless ``validate`` is on (the default on CPU only).
On CUDA, Triton kernels (:mod:`._triton`) replace the tensor ops where they launch many: the sum
tree's descent (:meth:`TorchSumTree.scan_lower_bound`) is one kernel, and the recomputation of
updated leaves' ancestors one kernel per level, with the same arithmetic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import torch

from tdreplay.core.utils import check_flag, restore_attributes

from . import _triton
from ._base import MinOverSumTree, MinTree, SegmentTree, SumTree, index_error
from ._layout import FANOUT

__all__ = ["TorchMinOverSumTree", "TorchMinTree", "TorchSumTree", "update_together"]


def _pair_sums(values: torch.Tensor) -> torch.Tensor:
    """``values[:, 0] + values[:, 1], values[:, 2] + values[:, 3], ...`` (one elementwise add)."""
    return values[:, 0::2] + values[:, 1::2]


def _block_minima(blocks: torch.Tensor) -> torch.Tensor:
    """The minimum of each row of 8 of ``blocks`` (``[n, 8]``), by elementwise minima of halves
    (a reduction over a dim of 8 is slow on CPU)."""
    quad = torch.minimum(blocks[:, :4], blocks[:, 4:])
    duo = torch.minimum(quad[:, :2], quad[:, 2:])
    return torch.minimum(duo[:, 0], duo[:, 1])


def _as_tensor(x: Any) -> torch.Tensor:
    """``x`` as a tensor (a tensor detached; a numpy array made contiguous first)."""
    if isinstance(x, torch.Tensor):
        return x.detach()
    if isinstance(x, np.ndarray):
        return torch.as_tensor(np.ascontiguousarray(x))
    return torch.as_tensor(x)


def _flat_index(index: Any, capacity: int, device: torch.device, validate: bool
                ) -> tuple[torch.Tensor, torch.Size]:
    """``(index as a flat int64 tensor on device, its original shape)``; ``TypeError`` unless
    it holds integers and, with ``validate``, ``IndexError`` unless they lie in
    ``[0, capacity)`` (checked on the host)."""
    t = _as_tensor(index)
    if t.dtype == torch.bool or t.is_floating_point() or t.is_complex():
        raise TypeError(f"index must hold integers, got dtype {t.dtype}")
    shape = t.shape
    t = t.reshape(-1).to(device=device, dtype=torch.int64)
    if validate and t.numel():
        lo, hi = (int(v) for v in torch.aminmax(t))
        if lo < 0 or hi >= capacity:
            raise index_error(capacity, lo, hi)
    return t, shape


def _value_tensor(value: Any, n: int, shape: torch.Size, device: torch.device) -> torch.Tensor:
    """``value`` (a scalar, or one per entry of an index of ``shape`` holding ``n``) as ``n``
    float64 leaf values on ``device``; ``TypeError`` / ``ValueError`` otherwise."""
    t = _as_tensor(value)
    if t.dtype == torch.bool or t.is_complex():
        raise TypeError(f"value must hold real numbers, got dtype {t.dtype}")
    t = t.to(device=device, dtype=torch.float64)
    if t.ndim == 0:
        return t.expand(n)
    if t.numel() != n:
        raise ValueError(
            f"value must be a scalar or match index: index has shape {tuple(shape)}, "
            f"value has shape {tuple(t.shape)}"
        )
    return t.reshape(-1)


def _below(x: torch.Tensor) -> torch.Tensor:
    """``nextafter(x, -inf)`` for float64 ``x > 0``, as the numba kernels compute it (bits - 1)."""
    return (x.view(torch.int64) - 1).view(torch.float64)


def _step(m: torch.Tensor, go_right: torch.Tensor, left: torch.Tensor, right: torch.Tensor
          ) -> torch.Tensor:
    """One binary step of the descent: where going right, ``min(m - left, below(right))``.

    ``right > 0`` wherever ``go_right`` holds (see ``_numba_kernels.scan``); elsewhere the value of
    ``_below`` is discarded.
    """
    return torch.where(go_right, torch.minimum(m - left, _below(right)), m)


class _TorchTree(SegmentTree):
    backend = "torch"

    def __init__(
        self,
        capacity: int,
        *,
        backend: str | None = "torch",
        device: Any = None,
        validate: bool | None = None,
    ) -> None:
        if backend not in (None, "torch"):
            raise ValueError(f"backend must be 'torch' for {type(self).__name__}, got {backend!r}")
        validate = check_flag(validate, "validate", allow_none=True)
        self._init_layout(capacity)
        self._tree = torch.full(
            (self._layout.size,),
            self.identity,
            dtype=torch.float64,
            device=torch.device("cpu") if device is None else device,
        )
        self._validate_opt = validate
        self._on_device_changed()

    def _on_device_changed(self) -> None:
        self.device = self._tree.device
        self._ninf = torch.full((), -math.inf, dtype=torch.float64, device=self.device)

    def __setstate__(self, state: dict[str, Any]) -> None:
        restore_attributes(self, state)
        self._on_device_changed()  # the device constants, also those a pickle predates

    def _level(self, level: int) -> torch.Tensor:
        """Level ``level`` of the tree as a flat view."""
        return self._tree[self._layout.level(level)]

    def _blocks(self, level: int) -> torch.Tensor:
        """Level ``level`` (``>= 1``) of the tree as rows of 8 siblings (a view)."""
        return self._level(level).view(-1, FANOUT)

    @property
    def nodes(self) -> torch.Tensor:
        """The flat float64 node tensor on :attr:`device` (a view; see
        :class:`~._layout.TreeLayout`).

        Examples
        --------
        >>> tree = TorchSumTree(3)
        >>> tree.update(torch.tensor([1]), torch.tensor([2.0]))
        >>> tree.nodes[tree.layout.leaf_offset + 1].item()
        2.0
        """
        return self._tree

    @property
    def validate(self) -> bool:
        """Whether indices (and the total before a scan) are checked on the host."""
        if self._validate_opt is not None:
            return self._validate_opt
        return self.device.type == "cpu"

    def to(self, device: Any) -> _TorchTree:
        """Move the tree to ``device`` in place and return it."""
        self._tree = self._tree.to(device)
        self._on_device_changed()
        return self

    # -- conversions --------------------------------------------------------------------------
    def _index(self, index: Any) -> tuple[torch.Tensor, torch.Size, torch.Tensor | None]:
        """Return ``(flat int64 index on device, original shape, valid mask or None)``."""
        t, shape = _flat_index(index, self.capacity, self.device, self.validate)
        if self.validate:
            return t, shape, None
        return t, shape, (t >= 0) & (t < self.capacity)


    def _combine(self, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
        """Reduce two values (tensors of the same shape)."""
        raise NotImplementedError

    def _reduce_blocks(self, blocks: torch.Tensor) -> torch.Tensor:
        """Reduce each row of 8 children of ``blocks`` (``[n, 8]``) to its parent's value."""
        raise NotImplementedError

    # -- interface ----------------------------------------------------------------------------
    def update(self, index: Any, value: Any) -> None:
        """Set ``leaf[index[k]] = value[k]`` with O(log C) batched tensor ops.

        ``index`` holds integers in ``[0, capacity)`` (any shape, flattened; numpy arrays and
        tensors on other devices are moved); ``value`` is a scalar or has as many elements.
        Duplicates: the last occurrence wins, without sorting: the targeted leaves first
        receive the largest batch position aimed at them (``scatter_reduce`` with ``amax``, which
        is order-independent), only those winners write their value, the others write to the
        never-read ``TreeLayout.scratch`` position. Then each level of ancestors is
        recomputed from its blocks of 8 children (one Triton kernel per level on CUDA); an
        ancestor shared by several leaves gets identical values from each, so the result never
        depends on the order in which the device applies the writes.
        """
        leaves = self.write_leaves(index, value)
        if leaves is not None:
            self.refresh_ancestors(leaves)

    def write_leaves(self, index: Any, value: Any, *also: tuple[_TorchTree, Any]
                     ) -> torch.Tensor | None:
        """The leaf writes of :meth:`update`, without recomputing the ancestors: returns the
        leaves to pass to :meth:`refresh_ancestors` (flat int64, in range: ignored entries name
        leaf 0, which changes nothing), ``None`` for an empty update.

        ``also``: ``(tree, value)`` pairs of other torch trees of the same capacity and device,
        written at the same leaves (the index is converted and its duplicates resolved once, for
        all of them; their ancestors are theirs to refresh).

        Examples
        --------
        >>> tree = TorchSumTree(10)
        >>> leaves = tree.write_leaves(torch.tensor([3, 7]), torch.tensor([1.0, 2.0]))
        >>> tree.total().item()  # not recomputed yet
        0.0
        >>> tree.refresh_ancestors(leaves)
        >>> tree.total().item()
        3.0
        """
        idx, shape, valid = self._index(index)
        n = idx.shape[0]
        values = [_value_tensor(value, n, shape, self.device),
                  *(_value_tensor(v, n, shape, self.device) for _, v in also)]
        if n == 0:
            return None
        tree = self._tree
        scratch = self._layout.scratch
        pos = idx + self._layout.leaf_offset
        if valid is not None:
            pos = torch.where(valid, pos, scratch)
        if n > 1:  # this tree's leaves pick the winners, then every tree writes theirs
            order = torch.arange(n, dtype=torch.float64, device=self.device)
            tree.scatter_(0, pos, -1.0)
            tree.scatter_reduce_(0, pos, order, reduce="amax")
            pos = torch.where(tree.index_select(0, pos) == order, pos, scratch)
        for nodes, vals in zip([tree, *(other.nodes for other, _ in also)], values):
            nodes.scatter_(0, pos, vals)
        return idx if valid is None else torch.where(valid, idx, 0)

    def refresh_ancestors(self, leaves: torch.Tensor) -> None:
        """Recompute the ancestors of ``leaves`` (flat int64 on :attr:`device`, in range; see
        :meth:`write_leaves`): one Triton kernel per level on CUDA, else tensor ops."""
        if _triton.runs_on(self.device) and _triton.refresh(leaves, _kernel_levels(self)):
            return
        node = leaves
        for level in range(self._layout.depth - 1, -1, -1):
            node = node >> 3
            parents = self._reduce_blocks(self._blocks(level + 1).index_select(0, node))
            self._level(level).scatter_(0, node, parents)

    def get(self, index: Any) -> torch.Tensor:
        """Return the leaf values at ``index`` as a float64 tensor of the same shape."""
        idx, shape, valid = self._index(index)
        if valid is None:
            out = self._tree.index_select(0, idx + self._layout.leaf_offset)
        else:
            out = self._tree.index_select(0, torch.where(valid, idx + self._layout.leaf_offset, 0))
            out = torch.where(valid, out, self.identity)
        return out.reshape(shape)

    def query(self, start: int = 0, end: int | None = None) -> torch.Tensor:
        """Return the reduction of leaves ``start .. end - 1`` as a 0-d tensor on the device.

        Reduces the nodes of :meth:`TreeLayout.query_positions` in the order of the numba
        backend (identical result).
        """
        start, end = self._check_range(start, end)
        tree = self._tree
        if start == 0 and end == self.capacity:
            return tree[self._layout.root].clone()
        res = torch.full((), self.identity, dtype=torch.float64, device=self.device)
        for pos in self._layout.query_positions(start, end):
            res = self._combine(res, tree[pos])
        return res

    def rebuild(self) -> None:
        """Recompute every internal node from the leaves (O(capacity), one op per level)."""
        for level in range(self._layout.depth - 1, -1, -1):
            parents = self._reduce_blocks(self._blocks(level + 1))
            self._level(level)[: parents.shape[0]] = parents
        self._tree[self._layout.scratch] = self.identity

    def _leaves_cpu(self) -> torch.Tensor:
        return self._tree[self._layout.leaves].to("cpu", copy=True)

    def _set_leaves(self, values: torch.Tensor) -> None:
        self._tree[self._layout.leaves].copy_(values)


class TorchSumTree(_TorchTree, SumTree):
    """Sum tree in a float64 tensor on any device; see :class:`~._base.SumTree`.

    Inputs may be tensors, numpy arrays or sequences; outputs are tensors on ``device``
    (``total()`` and ``query()`` return 0-d tensors so that nothing syncs on CUDA).

    Examples
    --------
    >>> import torch
    >>> tree = TorchSumTree(4)
    >>> tree.update(torch.tensor([0, 3]), torch.tensor([1.0, 3.0]))
    >>> tree.total()
    tensor(4., dtype=torch.float64)
    >>> tree.scan_lower_bound(torch.tensor([0.5, 1.5, 4.0]))
    tensor([0, 3, 3])
    >>> tree.get(torch.tensor([0, 1]))
    tensor([1., 0.], dtype=torch.float64)
    """

    def _combine(self, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
        return left + right

    def _reduce_blocks(self, blocks: torch.Tensor) -> torch.Tensor:
        # ((c0 + c1) + (c2 + c3)) + ((c4 + c5) + (c6 + c7)), as the numba kernels
        halves = _pair_sums(_pair_sums(blocks))
        return halves[:, 0] + halves[:, 1]

    def _on_device_changed(self) -> None:
        super()._on_device_changed()
        # the layout's level offsets, for the one-kernel descent
        self._level_starts = torch.tensor(self._layout.offsets, dtype=torch.int64,
                                          device=self.device)

    def total(self) -> torch.Tensor:
        """Return the sum of all leaves as a 0-d float64 tensor on the device."""
        return self._tree[self._layout.root].clone()

    def scan_lower_bound(self, mass: Any) -> torch.Tensor:
        """Batched prefix-sum search; see :meth:`~._base.SumTree.scan_lower_bound`.

        The whole batch descends one level per step (O(log C) tensor ops), or, on CUDA with
        Triton, in one kernel launch (the same leaves). Returns int64 leaf indices with the
        shape of ``mass`` on the tree's device.

        Raises
        ------
        ValueError
            If ``validate`` is on and the tree is empty (``total() <= 0``). Without validation
            an empty tree yields leaf 0.
        """
        m = _as_tensor(mass)
        if m.dtype == torch.bool or m.is_complex():
            raise TypeError(f"mass must hold real numbers, got dtype {m.dtype}")
        shape = m.shape
        m = m.reshape(-1).to(device=self.device, dtype=torch.float64)
        tree = self._tree
        if self.validate:
            total = float(tree[self._layout.root])
            if not total > 0.0:
                raise ValueError(
                    f"scan_lower_bound needs a tree with a positive total, got total={total}"
                )
        # the descent of the numba kernel, op for op (see _numba_kernels.scan)
        limit = torch.nextafter(tree[self._layout.root], self._ninf)
        if _triton.runs_on(self.device):  # the whole descent in one kernel
            leaves = _triton.descend(tree, self._level_starts, m.contiguous(), limit,
                                     self._layout.depth)
            if leaves is not None:
                return leaves.reshape(shape)
        m = torch.minimum(torch.where(m >= 0.0, m, 0.0), limit)  # into [0, limit]; NaN -> 0
        node = torch.zeros(m.shape, dtype=torch.int64, device=self.device)
        for level in range(1, self._layout.depth + 1):
            children = self._blocks(level).index_select(0, node)  # [B, 8]
            halves = _pair_sums(_pair_sums(children))
            # binary steps within the block, over halves, pairs and children (as in _numba_kernels)
            go_half = m >= halves[:, 0]
            m = _step(m, go_half, halves[:, 0], halves[:, 1])
            quad = torch.where(go_half.unsqueeze(1), children[:, 4:], children[:, :4])
            pairs = _pair_sums(quad)
            go_pair = m >= pairs[:, 0]
            m = _step(m, go_pair, pairs[:, 0], pairs[:, 1])
            duo = torch.where(go_pair.unsqueeze(1), quad[:, 2:], quad[:, :2])
            go_child = m >= duo[:, 0]
            m = _step(m, go_child, duo[:, 0], duo[:, 1])
            node = node * FANOUT + (go_half * 4 + go_pair * 2 + go_child)
        return node.reshape(shape)


class TorchMinTree(_TorchTree, MinTree):
    """Min tree in a float64 tensor on any device; see :class:`~._base.MinTree`.

    Examples
    --------
    >>> import torch
    >>> tree = TorchMinTree(4)
    >>> tree.update(torch.tensor([1, 2, 2]), torch.tensor([3.0, 9.0, 0.5]))
    >>> tree.min()
    tensor(0.5000, dtype=torch.float64)
    >>> tree.query(0, 2)
    tensor(3., dtype=torch.float64)
    """

    def _combine(self, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
        return torch.minimum(left, right)

    def _reduce_blocks(self, blocks: torch.Tensor) -> torch.Tensor:
        return _block_minima(blocks)

    def min(self) -> torch.Tensor:
        """Return the minimum over all leaves as a 0-d float64 tensor on the device."""
        return self._tree[self._layout.root].clone()


class TorchMinOverSumTree(MinOverSumTree):
    """The least positive leaf of a :class:`TorchSumTree`, on its device; see
    :class:`~._base.MinOverSumTree`. Updates are a fixed number of tensor ops per level.

    Examples
    --------
    >>> sums = TorchSumTree(20)
    >>> mins = TorchMinOverSumTree(sums)
    >>> sums.update(torch.tensor([3, 17]), torch.tensor([2.0, 0.5]))
    >>> mins.refresh(torch.tensor([3, 17]))
    >>> mins.min()
    tensor(0.5000, dtype=torch.float64)
    >>> sums.update(torch.tensor([17]), torch.tensor([0.0]))  # emptied: no longer a candidate
    >>> mins.refresh(torch.tensor([17]))
    >>> mins.min()
    tensor(2., dtype=torch.float64)
    """

    backend = "torch"

    def __init__(self, sum_tree: TorchSumTree) -> None:
        super().__init__(sum_tree)
        self._sums = sum_tree  # typed as what it is
        self.device = sum_tree.device
        self._nodes = torch.full((self.layout.leaf_offset,), math.inf, dtype=torch.float64,
                                 device=self.device)
        self.rebuild()

    @property
    def nodes(self) -> torch.Tensor:
        """Levels ``0 .. depth - 1`` of the layout on :attr:`device` (a view)."""
        return self._nodes

    def _level(self, level: int) -> torch.Tensor:
        return self._nodes[self.layout.level(level)]

    def _leaf_minima(self, blocks: torch.Tensor) -> torch.Tensor:
        """The least positive value of each row of 8 sum-tree leaves (``+inf`` if none)."""
        return _block_minima(torch.where(blocks > 0.0, blocks, math.inf))

    def refresh(self, index: Any) -> None:
        """Recompute the nodes above the leaves ``index``, O(log C) tensor ops.

        With the sum tree's ``validate`` on, indices out of ``[0, capacity)`` raise
        ``IndexError``; otherwise they are clamped into it, which changes nothing (a node
        recomputed from unchanged leaves keeps its value).
        """
        idx, _ = _flat_index(index, self.capacity, self.device, self._sums.validate)
        if not idx.numel():
            return
        layout = self.layout
        leaf = idx.clamp(0, self.capacity - 1)
        if _triton.runs_on(self.device) and _triton.refresh(leaf, _kernel_levels(self)):
            return
        node = leaf >> 3
        leaves = self._sums.nodes[layout.leaf_offset:].view(-1, FANOUT)
        self._level(layout.depth - 1).scatter_(
            0, node, self._leaf_minima(leaves.index_select(0, node)))
        for level in range(layout.depth - 2, -1, -1):
            node = node >> 3
            children = self._level(level + 1).view(-1, FANOUT).index_select(0, node)
            self._level(level).scatter_(0, node, _block_minima(children))

    def rebuild(self) -> None:
        """Recompute every node from the sum tree's leaves (O(capacity), one op per level)."""
        layout = self.layout
        bottom = self._leaf_minima(self._sums.nodes[layout.leaf_offset:].view(-1, FANOUT))
        self._level(layout.depth - 1)[: bottom.shape[0]] = bottom
        for level in range(layout.depth - 2, -1, -1):
            parents = _block_minima(self._level(level + 1).view(-1, FANOUT))
            self._level(level)[: parents.shape[0]] = parents

    def min(self) -> torch.Tensor:
        """The least positive leaf of the sum tree (``inf`` if none), a 0-d tensor."""
        return self._nodes[0].clone()


def _kernel_levels(tree: _TorchTree | TorchMinOverSumTree
                   ) -> tuple[Sequence[torch.Tensor], int, int]:
    """``tree`` as :func:`._triton.refresh` takes it: its levels (a min over sums: its own
    levels above the sum tree's leaves, then those leaves), and their reductions."""
    layout = tree.layout
    if isinstance(tree, TorchMinOverSumTree):
        return ([*tree.nodes.split(layout.level_sizes[:-1]),
                 tree.sum_tree.nodes[layout.leaf_offset:]], _triton.MIN, _triton.MIN_POSITIVE)
    op = _triton.SUM if isinstance(tree, TorchSumTree) else _triton.MIN
    return tree.nodes.split(layout.level_sizes), op, op


def update_together(trees: Sequence[tuple[SumTree | MinTree, Any]], index: Any,
                    minima: MinOverSumTree | None = None) -> None:
    """``tree.update(index, value)`` for each ``(tree, value)`` of ``trees`` (torch trees of one
    capacity, on one device), then ``minima.refresh(index)`` (a :class:`TorchMinOverSumTree` of
    the first tree): the same nodes as those calls, but on CUDA the ancestors in every tree are
    recomputed together, with one kernel launch per level for all of them.

    Examples
    --------
    >>> sums, maxima = TorchSumTree(100), TorchMinTree(100)
    >>> minima = TorchMinOverSumTree(sums)
    >>> update_together([(sums, torch.tensor([2.0, 5.0])), (maxima, torch.tensor([-2.0, -5.0]))],
    ...                 torch.tensor([10, 20]), minima)
    >>> sums.total().item(), -maxima.min().item(), minima.min().item()
    (7.0, 5.0, 2.0)
    """
    (first, first_value), *rest = [(cast(_TorchTree, tree), value) for tree, value in trees]
    leaves = first.write_leaves(index, first_value, *rest)  # one index conversion for all
    if leaves is None:
        return
    torch_trees = [first, *(tree for tree, _ in rest)]
    if _triton.runs_on(torch_trees[0].device):
        together = [_kernel_levels(tree) for tree in torch_trees]
        if minima is not None:
            together.append(_kernel_levels(cast(TorchMinOverSumTree, minima)))
        if _triton.refresh(leaves, *together):
            return
    for tree in torch_trees:
        tree.refresh_ancestors(leaves)
    if minima is not None:
        minima.refresh(index)
