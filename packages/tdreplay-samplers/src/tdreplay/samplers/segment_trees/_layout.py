"""The flat node layout shared by both segment-tree backends (8-ary, cache-line blocks)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import ClassVar

__all__ = ["FANOUT", "TreeLayout"]

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

    @cached_property
    def level_sizes(self) -> tuple[int, ...]:
        """Length of each level, padding included, root level first: ``nodes.split(level_sizes)``
        views every level at once.

        Examples
        --------
        >>> TreeLayout(1000).level_sizes
        (8, 8, 16, 128, 1024)
        """
        return (*(b - a for a, b in zip(self.offsets, self.offsets[1:])),
                self.size - self.leaf_offset)

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
