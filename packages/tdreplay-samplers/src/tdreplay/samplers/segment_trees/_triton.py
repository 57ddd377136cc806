"""The sum tree's descent in one Triton kernel, for trees on a CUDA device.

The tensor-op descent of :meth:`TorchSumTree.scan_lower_bound` launches about 30 small kernels
per tree level; this kernel walks every mass of the batch from the root to its leaf in one
launch, with the same float64 arithmetic op for op (see ``_numba_kernels.scan``), so both give
the same leaves. Triton comes with PyTorch's CUDA builds on Linux; where it is missing, or its
first launch fails, or with ``TDREPLAY_TRITON=0`` set, the tree keeps the tensor-op descent.
Under Triton's interpreter
(``TRITON_INTERPRET=1``) the kernel also runs on host tensors: that is how the tests check it
without a GPU.
"""

from __future__ import annotations

import contextlib
import os
import warnings

import torch

__all__ = ["descend", "runs_on"]

#: Masses per program (each walks its masses down together).
_BLOCK = 256
#: Devices where a launch failed: they keep the tensor-op descent.
_failed: set[torch.device] = set()


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def runs_on(device: torch.device) -> bool:
    """Whether :func:`descend` serves trees on ``device``: CUDA devices with Triton installed,
    or any device under Triton's interpreter, unless Triton failed there or the environment
    variable ``TDREPLAY_TRITON`` is ``0`` (read at each call: to compare the two descents)."""
    if (device.type != "cuda" and not _interpreting()) or device in _failed:
        return False
    if os.environ.get("TDREPLAY_TRITON", "1") == "0":
        return False
    try:
        from . import _triton_kernels  # imports Triton: only for trees that would use it
    except Exception as err:  # a broken Triton install: descend with tensor ops
        _give_up(device, err)
        return False
    return _triton_kernels.AVAILABLE


def _give_up(device: torch.device, err: Exception) -> None:
    """Keep the tensor-op descent on ``device`` from now on, and say why."""
    _failed.add(device)
    warnings.warn(f"the Triton descent failed on {device} ({type(err).__name__}: {err}); the "
                  f"sum tree descends with tensor operations there", RuntimeWarning, stacklevel=4)


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
    try:
        from ._triton_kernels import descent

        grid = (-(-mass.numel() // _BLOCK),)
        # Triton launches on the current CUDA device
        with torch.cuda.device(mass.device) if mass.is_cuda else contextlib.nullcontext():
            descent[grid](tree, offsets, mass, limit, out, mass.numel(), DEPTH=depth,
                          BLOCK=_BLOCK)
    except Exception as err:  # no usable compiler or device for Triton: descend with tensor ops
        _give_up(mass.device, err)
        return None
    return out
