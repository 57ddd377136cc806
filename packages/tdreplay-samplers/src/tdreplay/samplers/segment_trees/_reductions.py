"""Codes of the block reductions the Triton kernels compute (the ``OP`` of
``_triton_kernels.refresh_level``), shared by them and their host side (:mod:`._triton`)."""

from __future__ import annotations

__all__ = ["MIN", "MIN_POSITIVE", "SUM"]

#: A block of 8 children reduces to their sum, their minimum, or the minimum of their positive
#: values (``+inf`` if none: a min tree over a sum tree's leaves).
SUM, MIN, MIN_POSITIVE = 0, 1, 2
