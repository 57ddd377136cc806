"""The sum tree's descent in one Triton kernel, for trees on a CUDA device.

The tensor-op descent of :meth:`TorchSumTree.scan_lower_bound` launches about 30 small kernels
per tree level; this kernel walks every mass of the batch from the root to its leaf in one
launch, with the same float64 arithmetic op for op (see ``_numba_kernels.scan``), so both give
the same leaves. Triton comes with PyTorch's CUDA builds on Linux; where it is missing, or its
first launch fails, the tree keeps the tensor-op descent. Under Triton's interpreter
(``TRITON_INTERPRET=1``) the kernel also runs on host tensors: that is how the tests check it
without a GPU.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import warnings

import torch

from ._layout import FANOUT

__all__ = ["descend", "runs_on"]

#: Masses per program (each walks its masses down together).
_BLOCK = 256
#: Devices where a launch failed: they keep the tensor-op descent.
_failed: set[torch.device] = set()


if FANOUT != 8:  # pragma: no cover - the kernel reads blocks of 8 children
    raise ImportError("the Triton descent needs the 8-ary layout")


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.cache
def _installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def runs_on(device: torch.device) -> bool:
    """Whether :func:`descend` serves trees on ``device``: CUDA devices with Triton installed,
    or any device under Triton's interpreter, unless a launch there failed."""
    if device in _failed or not _installed():
        return False
    return device.type == "cuda" or _interpreting()


def descend(tree: torch.Tensor, offsets: torch.Tensor, mass: torch.Tensor, limit: torch.Tensor,
            depth: int) -> torch.Tensor | None:
    """The leaf of each flat float64 ``mass`` (int64, on the tree's device), or ``None`` when
    the kernel cannot run there (the caller then descends with tensor ops). The kernel
    (:mod:`._triton_kernels`) is imported on first use.

    ``offsets`` holds the layout's level starts (int64, on the device) and ``limit`` the 0-d
    upper clamp of the masses (``nextafter(total, -inf)``).
    """
    out = torch.empty(mass.shape, dtype=torch.int64, device=mass.device)
    if not mass.numel():
        return out
    try:
        from ._triton_kernels import descent

        grid = (-(-mass.numel() // _BLOCK),)
        descent[grid](tree, offsets, mass, limit, out, mass.numel(), DEPTH=depth, BLOCK=_BLOCK)
    except Exception as err:  # no usable compiler or device for Triton: descend with tensor ops
        _failed.add(mass.device)
        warnings.warn(f"the Triton descent failed on {mass.device} ({type(err).__name__}: "
                      f"{err}); the sum tree descends with tensor operations there",
                      RuntimeWarning, stacklevel=3)
        return None
    return out
