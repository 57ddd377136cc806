"""Triton kernels for segment trees on a CUDA device: the sum tree's descent, and the
recomputation of the ancestors of updated leaves.

The tensor-op descent of :meth:`TorchSumTree.scan_lower_bound` launches about 30 small kernels
per tree level; :func:`descend` walks every mass of the batch from the root to its leaf in one
launch, with the same float64 arithmetic op for op (see ``_numba_kernels.scan``), so both give
the same leaves. An update recomputes the ancestors of its leaves with about 6 tensor ops per
level; :func:`refresh` does it with one launch per level, reducing each block of 8 children in
the same order (the same node values).

Triton comes with PyTorch's CUDA builds on Linux; where it is missing, or a launch fails, or with
``TDREPLAY_TRITON=0`` set, the trees keep their tensor ops. Under Triton's interpreter
(``TRITON_INTERPRET=1``) the kernels also run on host tensors: that is how the tests check them
without a GPU.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable, Sequence

import torch

from ._reductions import MIN, MIN_POSITIVE, SUM

__all__ = ["MIN", "MIN_POSITIVE", "SUM", "descend", "launched", "refresh", "runs_on"]

#: Masses (or nodes) per program.
_BLOCK = 256
#: Devices where a launch failed: their trees keep tensor ops.
_failed: set[torch.device] = set()


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def runs_on(device: torch.device) -> bool:
    """Whether the kernels serve trees on ``device``: CUDA devices with Triton installed,
    or any device under Triton's interpreter, unless Triton failed there or the environment
    variable ``TDREPLAY_TRITON`` is ``0`` (read at each call: to compare with tensor ops)."""
    if (device.type != "cuda" and not _interpreting()) or device in _failed:
        return False
    if os.environ.get("TDREPLAY_TRITON", "1") == "0":
        return False
    try:
        from . import _triton_kernels  # imports Triton: only for trees that would use it
    except Exception as err:  # a broken Triton install: tensor ops
        _give_up(device, err)
        return False
    return _triton_kernels.AVAILABLE


def _give_up(device: torch.device, err: Exception) -> None:
    """Keep tensor ops on ``device`` from now on, and say why."""
    _failed.add(device)
    warnings.warn(f"a Triton kernel failed on {device} ({type(err).__name__}: {err}); the "
                  f"segment trees there use tensor operations instead", RuntimeWarning,
                  stacklevel=4)


def launched(device: torch.device, launch: Callable[[], object]) -> bool:
    """Run ``launch`` (which imports its kernels and launches them) on ``device`` (Triton
    launches on the current CUDA device). ``False`` when it raised: no usable compiler or
    device for Triton, so the kernels are off on ``device`` from now on (one warning) and the
    caller uses tensor ops."""
    try:
        with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
            launch()
    except Exception as err:
        _give_up(device, err)
        return False
    return True


def descend(tree: torch.Tensor, offsets: torch.Tensor, mass: torch.Tensor, limit: torch.Tensor,
            depth: int) -> torch.Tensor | None:
    """The leaf of each flat float64 ``mass`` (int64, on the tree's device), or ``None`` when
    the kernel cannot run there (the caller then descends with tensor ops). It launches on
    the masses' device, whichever CUDA device is current.

    ``offsets`` holds the layout's level starts (int64, on the device) and ``limit`` the 0-d
    upper clamp of the masses (``nextafter(total, -inf)``).
    """
    out = torch.empty(mass.shape, dtype=torch.int64, device=mass.device)
    if not mass.numel():
        return out

    def launch() -> None:
        from ._triton_kernels import descent

        descent[(-(-mass.numel() // _BLOCK),)](tree, offsets, mass, limit, out, mass.numel(),
                                               DEPTH=depth, BLOCK=_BLOCK)

    return out if launched(mass.device, launch) else None


def refresh(leaves: torch.Tensor, *trees: tuple[Sequence[torch.Tensor], int, int]) -> bool:
    """Recompute, from the bottom up, the ancestors of the leaves ``leaves`` (flat int64, on the
    trees' device, each in range) in one to three trees of one layout, with one launch per
    level for all of them. A tree is ``(levels, op, bottom_op)``: ``levels[d]`` its level ``d``
    as a flat view, ``levels[-1]`` its leaves (whole blocks of 8); level ``d`` reduces the
    blocks of level ``d + 1`` with ``op`` (:data:`SUM`, :data:`MIN` or :data:`MIN_POSITIVE`),
    the level just above the leaves with ``bottom_op``. A level with no more nodes than
    ``leaves`` is recomputed whole.

    Returns ``False`` when a launch failed (and the kernels are off on that device from now
    on): the caller recomputes every level with tensor ops.
    """
    n = leaves.numel()
    depth = len(trees[0][0]) - 1
    if not n:
        return True
    leaves = leaves.contiguous()
    # unused tree slots of the kernel get the first tree (never touched: TREES says so)
    slots = [*trees, *[trees[0]] * (3 - len(trees))]

    def launch() -> None:
        from ._triton_kernels import refresh_level

        for level in range(depth - 1, -1, -1):
            nodes = trees[0][0][level + 1].numel() // 8
            every = nodes <= n
            count = nodes if every else n
            views = [(levels[level + 1], levels[level]) for levels, _, _ in slots]
            ops = [bottom if level == depth - 1 else op for _, op, bottom in slots]
            refresh_level[(-(-count // _BLOCK),)](
                leaves, count, 3 * (depth - level), *views[0], *views[1], *views[2],
                OP0=ops[0], OP1=ops[1], OP2=ops[2], TREES=len(trees), EVERY=every,
                BLOCK=_BLOCK)

    return launched(leaves.device, launch)
