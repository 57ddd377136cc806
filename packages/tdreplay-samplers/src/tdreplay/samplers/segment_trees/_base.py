"""Backend-independent parts of the segment trees: the interfaces, validation and state.

:class:`SegmentTree` is what both backends share; :class:`SumTree` and :class:`MinTree` add the
operations of each reduction. The backends subclass them (:mod:`._numba`, :mod:`._torch`); this
module imports neither: a backend is chosen by the factory (:mod:`._factory`).
"""

from __future__ import annotations

import abc
import math
import operator
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import torch

from ._layout import TreeLayout

__all__ = ["MinOverSumTree", "MinTree", "SegmentTree", "SumTree", "check_capacity", "index_error"]


def check_capacity(capacity: Any) -> int:
    """Return ``capacity`` as an int; ``TypeError`` / ``ValueError`` unless it is a positive int.

    Examples
    --------
    >>> check_capacity(8)
    8
    """
    if isinstance(capacity, bool):
        raise TypeError(f"capacity must be a positive int, got {capacity!r}")
    try:
        value = operator.index(capacity)
    except TypeError:
        raise TypeError(
            f"capacity must be a positive int, got {type(capacity).__name__} {capacity!r}"
        ) from None
    if value <= 0:
        raise ValueError(f"capacity must be a positive int, got {value}")
    return value


def index_error(capacity: int, lo: int, hi: int) -> IndexError:
    """The error for indices in ``[lo, hi]`` of a tree of ``capacity`` leaves.

    Examples
    --------
    >>> index_error(4, -1, 2)
    IndexError('index out of range: expected 0 <= index < capacity=4, got values in [-1, 2]')
    """
    return IndexError(
        f"index out of range: expected 0 <= index < capacity={capacity}, "
        f"got values in [{lo}, {hi}]"
    )


class SegmentTree(abc.ABC):
    """Common interface of the sum and min segment trees.

    A tree holds ``capacity`` leaves, indexed ``0 .. capacity - 1`` (the flat slot indices of a
    replay buffer), stored in float64 in the flat array of an 8-ary tree laid out by
    :class:`~._layout.TreeLayout` (the 8 children of a node fill one 64-byte cache line).
    Leaves never written hold the identity of the reduction (``0`` for sums, ``+inf`` for
    minima), padding leaves ``capacity .. leaf_count - 1`` included.

    Drift: :meth:`update` sets the leaves and then *recomputes* every ancestor from its 8
    children (``((c0 + c1) + (c2 + c3)) + ((c4 + c5) + (c6 + c7))`` or their minimum) instead of
    adding deltas, so every internal node is always exactly the float64 reduction of its
    children and rounding error does not accumulate over millions of updates. Both backends
    perform the same IEEE operations in the same order, so they hold bit-identical trees after
    the same updates.

    Values are not checked: NaN, negative (for sums) or infinite priorities are the caller's job
    (the prioritized sampler validates them) and make results unspecified.

    Do not instantiate this class; use :func:`~._factory.make_sum_tree` /
    :func:`~._factory.make_min_tree` (which pick a backend) or the concrete classes.
    """

    #: ``"sum"`` or ``"min"``.
    kind: ClassVar[str]
    #: Value of an empty leaf.
    identity: ClassVar[float]
    #: ``"numba"`` or ``"torch"``.
    backend: ClassVar[str]

    capacity: int
    device: torch.device

    def _init_layout(self, capacity: Any) -> None:
        """Check ``capacity`` and set ``capacity`` and the node layout (both backends)."""
        self.capacity = check_capacity(capacity)
        self._layout = TreeLayout(self.capacity)

    @property
    def layout(self) -> TreeLayout:
        """Where the nodes sit in :attr:`nodes` (shared by both backends)."""
        return self._layout

    @property
    @abc.abstractmethod
    def nodes(self) -> np.ndarray | torch.Tensor:
        """The flat float64 node array laid out by :attr:`layout` (a view, not a copy)."""

    # -- abstract backend hooks -------------------------------------------------------------
    @abc.abstractmethod
    def update(self, index: Any, value: Any) -> None:
        """Set ``leaf[index] = value`` for a batch (last occurrence wins for duplicates)."""

    @abc.abstractmethod
    def get(self, index: Any) -> np.ndarray | float | torch.Tensor:
        """Return the leaf values at ``index`` (same shape as ``index``)."""

    @abc.abstractmethod
    def query(self, start: int = 0, end: int | None = None) -> float | torch.Tensor:
        """Return the reduction of the leaves ``start .. end - 1``."""

    @abc.abstractmethod
    def rebuild(self) -> None:
        """Recompute every internal node from the leaves, in O(capacity)."""

    @abc.abstractmethod
    def _leaves_cpu(self) -> torch.Tensor:
        """Return a CPU float64 copy of the ``capacity`` leaf values."""

    @abc.abstractmethod
    def _set_leaves(self, values: torch.Tensor) -> None:
        """Overwrite the leaves with ``values`` (CPU float64, already validated)."""

    # -- shared behaviour -------------------------------------------------------------------
    def __len__(self) -> int:
        return self.capacity

    def __getitem__(self, index: Any) -> np.ndarray | float | torch.Tensor:
        return self.get(index)

    def __setitem__(self, index: Any, value: Any) -> None:
        self.update(index, value)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(capacity={self.capacity}, backend={self.backend!r}, "
            f"device={self.device})"
        )

    def _check_range(self, start: int, end: int | None) -> tuple[int, int]:
        start = operator.index(start)
        end = self.capacity if end is None else operator.index(end)
        if not 0 <= start <= end <= self.capacity:
            raise IndexError(
                f"query range must satisfy 0 <= start <= end <= capacity={self.capacity}, "
                f"got start={start}, end={end}"
            )
        return start, end

    def state_dict(self) -> dict[str, Any]:
        """Return ``{"capacity": int, "values": CPU float64 tensor of the leaves}``.

        The state holds only the leaves; internal nodes are recomputed on load. It loads into a
        tree of either backend.
        """
        return {"capacity": self.capacity, "values": self._leaves_cpu()}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore the leaves from :meth:`state_dict` output and :meth:`rebuild` the tree.

        Raises
        ------
        ValueError
            If a key is missing, the capacity differs from this tree's, or ``values`` does not
            hold ``capacity`` real numbers. The tree is left unchanged.
        """
        if not isinstance(state_dict, Mapping):
            raise ValueError(f"state_dict must be a mapping, got {type(state_dict).__name__}")
        missing = [key for key in ("capacity", "values") if key not in state_dict]
        if missing:
            raise ValueError(f"state_dict is missing key(s) {missing}")
        capacity = state_dict["capacity"]
        try:
            capacity = operator.index(capacity)
        except TypeError:
            raise ValueError(f"state_dict['capacity'] must be an int, got {capacity!r}") from None
        if capacity != self.capacity:
            raise ValueError(
                f"capacity mismatch: state_dict has capacity={capacity}, "
                f"this tree has capacity={self.capacity}"
            )
        values = state_dict["values"]
        if isinstance(values, np.ndarray):
            values = torch.from_numpy(values)
        if not isinstance(values, torch.Tensor):
            raise ValueError(
                f"state_dict['values'] must be a tensor or array, got {type(values).__name__}"
            )
        if values.dtype == torch.bool or values.is_complex():
            raise ValueError(f"state_dict['values'] must be real numbers, got {values.dtype}")
        if tuple(values.shape) != (self.capacity,):
            raise ValueError(
                f"values shape mismatch: state_dict['values'] has shape {tuple(values.shape)}, "
                f"expected ({self.capacity},)"
            )
        values = values.detach().to(device="cpu", dtype=torch.float64).contiguous()
        self._set_leaves(values)
        self.rebuild()


class SumTree(SegmentTree):
    """Interface of the sum trees: leaves are ``0`` until set; the root is their sum.

    Implemented by :class:`~._numba.NumbaSumTree` and :class:`~._torch.TorchSumTree`; build one
    with :func:`~._factory.make_sum_tree` (or ``SumSegmentTree(...)``), which picks the backend.
    """

    kind = "sum"
    identity = 0.0

    @abc.abstractmethod
    def total(self) -> float | torch.Tensor:
        """Return the sum of all leaves (the root)."""

    def sum(self) -> float | torch.Tensor:
        """Alias of :meth:`total`."""
        return self.total()

    @abc.abstractmethod
    def scan_lower_bound(self, mass: Any) -> np.ndarray | int | torch.Tensor:
        """For each ``m`` in ``mass``, return the smallest leaf ``i`` with ``prefix_sum(0..i) > m``.

        This is the proportional prioritized-replay descent of a binary sum tree, whose nodes
        are the stored ones and, within each block of 8 children, the pairwise sums that make
        up their parent: at each node, go left if ``m < left`` else subtract ``left`` and go
        right. ``m`` is first clamped to
        ``[0, nextafter(total, 0)]`` (NaN counts as ``0``), and when going right ``m`` is clamped
        below the right child, so the descent always stays in a subtree with positive sum and
        always ends on a leaf with a positive value and an index ``< capacity``, even when
        ``m >= total`` or with rounding at boundaries. Requires ``total() > 0``.
        """


class MinTree(SegmentTree):
    """Interface of the min trees: leaves are ``+inf`` until set; the root is their minimum.

    Implemented by :class:`~._numba.NumbaMinTree` and :class:`~._torch.TorchMinTree`; build one
    with :func:`~._factory.make_min_tree` (or ``MinSegmentTree(...)``).
    """

    kind = "min"
    identity = math.inf

    @abc.abstractmethod
    def min(self) -> float | torch.Tensor:
        """Return the minimum over all leaves (``+inf`` if none was set)."""


class MinOverSumTree(abc.ABC):
    """The least positive leaf of a :class:`SumTree`, kept without a copy of its leaves.

    A min tree of the sum tree's :class:`~._layout.TreeLayout` whose leaf level *is* the sum
    tree's: :attr:`nodes` holds only the internal levels ``0 .. depth - 1`` (about
    ``capacity / 7`` float64 values, against ``8 / 7 * capacity`` for a :class:`MinTree`), and
    each node of level ``depth - 1`` is the least positive value of its 8 sum-tree leaves
    (``+inf`` if none is positive: empty leaves, ``0`` in the sum tree, count as ``+inf``, as in
    a :class:`MinTree` whose leaves were set where the sum tree's are positive). A prioritized
    sampler stores ``p_i > 0`` for every written slot, so :meth:`min` is exactly the least
    stored priority, as a :class:`MinTree` holding the same ``p_i`` gives it.

    The leaves change through the sum tree only; :meth:`refresh` then recomputes the nodes
    above the changed leaves (the same block-minimum updates as :meth:`MinTree.update`, which
    read the 8 leaves the sum tree update has just written) and :meth:`rebuild` recomputes every
    node. Until then :meth:`min` is that of the leaves before the change. It has no state of its
    own: the sum tree's ``state_dict`` holds everything, and a :meth:`rebuild` after loading it
    restores the minimum.

    Build one with :func:`~._factory.make_min_over_sum`, which picks the backend of the sum
    tree.
    """

    #: ``"numba"`` or ``"torch"``, that of :attr:`sum_tree`.
    backend: ClassVar[str]
    #: Device of :attr:`nodes` (that of :attr:`sum_tree` when built).
    device: torch.device

    def __init__(self, sum_tree: SumTree) -> None:
        if not isinstance(sum_tree, SumTree) or sum_tree.backend != self.backend:
            raise TypeError(f"sum_tree must be a {self.backend} SumTree, got "
                            f"{type(sum_tree).__name__}")
        self._sum_tree = sum_tree

    @property
    def sum_tree(self) -> SumTree:
        """The sum tree whose leaves this tree's bottom nodes reduce."""
        return self._sum_tree

    @property
    def capacity(self) -> int:
        """Number of leaves (those of :attr:`sum_tree`)."""
        return self._sum_tree.capacity

    @property
    def layout(self) -> TreeLayout:
        """The layout of :attr:`sum_tree`; :attr:`nodes` holds its levels above the leaves."""
        return self._sum_tree.layout

    @property
    @abc.abstractmethod
    def nodes(self) -> np.ndarray | torch.Tensor:
        """The flat float64 internal nodes, ``layout.leaf_offset`` of them (a view)."""

    @abc.abstractmethod
    def refresh(self, index: Any) -> None:
        """Recompute the nodes above the sum tree's leaves ``index`` after they changed."""

    @abc.abstractmethod
    def rebuild(self) -> None:
        """Recompute every node from the sum tree's leaves, in O(capacity)."""

    @abc.abstractmethod
    def min(self) -> float | torch.Tensor:
        """The least positive leaf of the sum tree (``+inf`` if none), as of the last
        :meth:`refresh` / :meth:`rebuild` of the leaves that changed."""

    def __len__(self) -> int:
        return self.capacity

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(capacity={self.capacity}, backend={self.backend!r}, "
                f"device={self.device})")
