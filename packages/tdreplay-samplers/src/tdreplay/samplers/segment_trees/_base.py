"""Backend-independent parts of the segment trees: interface, validation, state."""

from __future__ import annotations

import abc
import math
import operator
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

__all__ = [
    "BACKENDS",
    "FANOUT",
    "MinSegmentTree",
    "SegmentTree",
    "SumSegmentTree",
    "TreeLayout",
]

#: Names accepted by the ``backend`` argument.
BACKENDS: tuple[str, ...] = ("numba", "torch")


def _check_capacity(capacity: Any) -> int:
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


#: Children per internal node: 8 float64 values fill one 64-byte cache line, so a descent or an
#: update reads one line per level and a 1,000,000-slot tree has 7 levels instead of 20.
FANOUT = 8


@dataclass(frozen=True)
class TreeLayout:
    """Where the nodes of a ``capacity``-leaf tree sit in its flat float64 array.

    Both backends use this layout and the same arithmetic, so they hold bit-identical arrays.
    The tree has ``depth + 1`` levels: level ``0`` is the root, level ``depth`` the leaves.
    Level ``d`` is stored contiguously from ``offsets[d]``; node ``j`` of level ``d`` has the
    children ``8j .. 8j + 7`` of level ``d + 1``, stored side by side (one aligned block of
    :data:`FANOUT` values). Level ``1`` holds ``r <= 8`` real nodes (padded to a block) and every
    deeper level ``8`` times as many as the one above, so the ``leaf_count = r * 8 ** (depth - 1)``
    leaves exceed ``capacity`` by less than ``8 ** (depth - 1)`` (less than ``capacity``).
    Padding nodes hold the identity of the reduction. Position :attr:`scratch` (in the root's
    block) is never read: the torch backend sends ignored writes there.

    Examples
    --------
    >>> layout = TreeLayout(1000)
    >>> layout.depth, layout.leaf_count, layout.offsets
    (4, 1024, (0, 8, 16, 32, 160))
    >>> layout.size, layout.leaf_offset
    (1184, 160)
    """

    capacity: int
    #: Number of levels below the root (``>= 1``).
    depth: int = field(init=False)
    #: Leaves allocated: ``capacity`` rounded up to a multiple of ``8 ** (depth - 1)``.
    leaf_count: int = field(init=False)
    #: Start of each level in the flat array, root level first (multiples of 8).
    offsets: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        depth, span = 1, 1  # span: leaves under one node of level 1
        while span * FANOUT < self.capacity:
            depth += 1
            span *= FANOUT
        roots = -(-self.capacity // span)  # real nodes of level 1
        sizes = [FANOUT, FANOUT] + [roots * FANOUT**d for d in range(1, depth)]
        starts = [0]
        for size in sizes[:-1]:
            starts.append(starts[-1] + size)
        object.__setattr__(self, "depth", depth)
        object.__setattr__(self, "leaf_count", roots * span)
        object.__setattr__(self, "offsets", tuple(starts))

    @property
    def leaf_offset(self) -> int:
        """Position of leaf ``0``."""
        return self.offsets[-1]

    @property
    def size(self) -> int:
        """Length of the flat array (the leaf level is at least one block long)."""
        return self.leaf_offset + max(self.leaf_count, FANOUT)

    @property
    def leaves(self) -> slice:
        """Positions of the ``capacity`` leaves."""
        return slice(self.leaf_offset, self.leaf_offset + self.capacity)

    def level(self, level: int) -> slice:
        """Positions of level ``level``, padding included (a whole number of blocks)."""
        end = self.offsets[level + 1] if level < self.depth else self.size
        return slice(self.offsets[level], end)

    #: Position of the root.
    root: ClassVar[int] = 0
    #: A position never read (the rest of the root's block is padding).
    scratch: ClassVar[int] = 1

    def query_positions(self, start: int, end: int) -> list[int]:
        """Positions whose reduction, in this order, is the reduction of leaves ``start..end-1``.

        At each level from the leaves up, the partial blocks at both ends are taken one node at a
        time (left end, then right end) and the whole blocks between them are left to the level
        above. Both backends reduce these positions in this order, so they agree exactly.
        """
        offsets = self.offsets
        positions: list[int] = []
        lo, hi, level = start, end, self.depth
        while lo < hi:
            if level == 0:
                positions.append(self.root)
                break
            up_lo = -(-lo // FANOUT) * FANOUT
            up_hi = hi // FANOUT * FANOUT
            left_end = min(hi, up_lo)
            right_start = max(left_end, up_hi)
            positions += range(offsets[level] + lo, offsets[level] + left_end)
            positions += range(offsets[level] + right_start, offsets[level] + hi)
            lo, hi, level = up_lo // FANOUT, up_hi // FANOUT, level - 1
        return positions


def _resolve_backend(backend: str | None, device: Any) -> str:
    if backend is None:
        if device is None or torch.device(device).type == "cpu":
            return "numba"
        return "torch"
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS} or None, got {backend!r}")
    return backend


class SegmentTree(abc.ABC):
    """Common interface of the sum and min segment trees.

    A tree holds ``capacity`` leaves, indexed ``0 .. capacity - 1`` (the flat slot indices of a
    replay buffer), stored in float64 in the flat array of an 8-ary tree laid out by
    :class:`TreeLayout` (the 8 children of a node fill one 64-byte cache line). Leaves never
    written hold the identity of the reduction (``0`` for sums, ``+inf`` for minima), padding
    leaves ``capacity .. leaf_count - 1`` included.

    Drift: :meth:`update` sets the leaves and then *recomputes* every ancestor from its 8
    children (``((c0 + c1) + (c2 + c3)) + ((c4 + c5) + (c6 + c7))`` or their minimum) instead of
    adding deltas, so every internal node is always exactly the float64 reduction of its
    children and rounding error does not accumulate over millions of updates. Both backends
    perform the same IEEE operations in the same order, so they hold bit-identical trees after
    the same updates.

    Values are not checked: NaN, negative (for sums) or infinite priorities are the caller's job
    (the prioritized sampler validates them) and make results unspecified.

    Do not instantiate this class; use :class:`SumSegmentTree` / :class:`MinSegmentTree` (which
    pick a backend) or the concrete classes.
    """

    #: ``"sum"`` or ``"min"``.
    kind: ClassVar[str]
    #: Value of an empty leaf.
    identity: ClassVar[float]
    #: ``"numba"`` or ``"torch"``.
    backend: ClassVar[str]

    capacity: int
    device: torch.device

    def __new__(cls, capacity: int | None = None, *args: Any, **kwargs: Any) -> SegmentTree:
        # ``SumSegmentTree(...)`` / ``MinSegmentTree(...)`` return the concrete class of the
        # backend. ``capacity`` is optional so that pickle can recreate a concrete tree (it
        # calls ``cls.__new__(cls)`` and then restores the instance's state).
        if cls in (SumSegmentTree, MinSegmentTree):
            from ._numba import NumbaMinTree, NumbaSumTree
            from ._torch import TorchMinTree, TorchSumTree

            backend = _resolve_backend(kwargs.get("backend"), kwargs.get("device"))
            concrete = {
                ("sum", "numba"): NumbaSumTree,
                ("sum", "torch"): TorchSumTree,
                ("min", "numba"): NumbaMinTree,
                ("min", "torch"): TorchMinTree,
            }
            cls = concrete[cls.kind, backend]
        return super().__new__(cls)

    def _init_layout(self, capacity: Any) -> None:
        """Check ``capacity`` and set ``capacity`` and the node layout (both backends)."""
        self.capacity = _check_capacity(capacity)
        self._layout = TreeLayout(self.capacity)

    # -- abstract backend hooks -------------------------------------------------------------
    @abc.abstractmethod
    def update(self, index: Any, value: Any) -> None:
        """Set ``leaf[index] = value`` for a batch (last occurrence wins for duplicates)."""

    @abc.abstractmethod
    def get(self, index: Any) -> Any:
        """Return the leaf values at ``index`` (same shape as ``index``)."""

    @abc.abstractmethod
    def query(self, start: int = 0, end: int | None = None) -> Any:
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

    def __getitem__(self, index: Any) -> Any:
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

    def _index_error(self, lo: int, hi: int) -> IndexError:
        return IndexError(
            f"index out of range: expected 0 <= index < capacity={self.capacity}, "
            f"got values in [{lo}, {hi}]"
        )

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


class SumSegmentTree(SegmentTree):
    """Sum segment tree over ``capacity`` float64 leaves (empty leaves are ``0``).

    Calling ``SumSegmentTree(capacity, backend=..., device=...)`` returns an instance of the
    concrete backend class (:class:`NumbaSumTree` or :class:`TorchSumTree`), which is also an
    instance of :class:`SumSegmentTree`.

    Parameters
    ----------
    capacity : int
        Number of leaves, ``> 0``.
    backend : {"numba", "torch", None}, optional
        ``"numba"``: CPU tree with numba kernels, takes and returns numpy arrays.
        ``"torch"``: tree in a torch tensor on ``device``, takes and returns tensors.
        ``None`` (default): ``"numba"`` if ``device`` is ``None`` or a CPU device, else ``"torch"``.
    device : torch.device or str, optional
        Device of the torch tree (default CPU). The numba tree only accepts CPU.
    validate : bool, optional
        Torch backend only: check that indices are in range (raising ``IndexError``) and that the
        tree is non-empty before :meth:`scan_lower_bound`. Checking needs the values on the host,
        so it defaults to ``True`` on CPU and ``False`` on other devices, where out-of-range
        indices are ignored by :meth:`update` and read as the empty-leaf value by :meth:`get`,
        without a host sync. The numba backend always validates.

    Examples
    --------
    >>> import numpy as np
    >>> tree = SumSegmentTree(5, backend="numba")
    >>> tree.update(np.array([0, 2, 4]), np.array([1.0, 2.0, 3.0]))
    >>> tree.total()
    6.0
    >>> tree.query(1, 4)
    2.0
    >>> tree.scan_lower_bound(np.array([0.5, 1.0, 2.9, 3.0, 100.0]))
    array([0, 2, 2, 4, 4])
    >>> ttree = SumSegmentTree(5, backend="torch")
    >>> ttree.load_state_dict(tree.state_dict())
    >>> ttree.scan_lower_bound(torch.tensor([0.5, 2.9, 3.0]))
    tensor([0, 2, 4])
    """

    kind = "sum"
    identity = 0.0

    @abc.abstractmethod
    def total(self) -> Any:
        """Return the sum of all leaves (the root)."""

    def sum(self) -> Any:
        """Alias of :meth:`total`."""
        return self.total()

    @abc.abstractmethod
    def scan_lower_bound(self, mass: Any) -> Any:
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


class MinSegmentTree(SegmentTree):
    """Min segment tree over ``capacity`` float64 leaves (empty leaves are ``+inf``).

    Calling ``MinSegmentTree(capacity, backend=..., device=...)`` returns an instance of
    :class:`NumbaMinTree` or :class:`TorchMinTree`; the arguments are those of
    :class:`SumSegmentTree`.

    Examples
    --------
    >>> import numpy as np
    >>> tree = MinSegmentTree(4)
    >>> tree.min()
    inf
    >>> tree.update(np.array([1, 3]), np.array([5.0, 2.0]))
    >>> tree.min(), tree.query(0, 2)
    (2.0, 5.0)
    >>> tree[np.array([0, 1])]
    array([inf,  5.])
    """

    kind = "min"
    identity = math.inf

    @abc.abstractmethod
    def min(self) -> Any:
        """Return the minimum over all leaves (``+inf`` if none was set)."""
