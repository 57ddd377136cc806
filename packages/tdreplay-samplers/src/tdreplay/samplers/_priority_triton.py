"""Which entries of a priority update on device trees apply, in two Triton kernels.

The tensor ops of :meth:`~._priority_kernels.TorchKernels.update` that decide it (the checks of
the values, the range, written and stale slots) dispatch about 25 small kernels;
:func:`kept_updates` launches two, :func:`~._priority_triton_kernels.find_refused` (is any
value refused? then nothing applies) and :func:`~._priority_triton_kernels.keep_updates`, with
the same results. They run where the segment trees' kernels run
(:func:`.segment_trees._triton.runs_on`), and hand back ``None`` elsewhere or when a launch
fails (with a warning, once): the caller then decides with tensor ops.
"""

from __future__ import annotations

import functools

import torch

from ._priority_state import PriorityState
from ._priority_values import leaf_limit, leaf_values
from .segment_trees._triton import launched, runs_on

__all__ = ["kept_updates"]

#: Updates per program.
_BLOCK = 256


@functools.cache
def _limit_on(capacity: int, device: torch.device) -> torch.Tensor:
    """``leaf_limit(capacity)`` as a 1-element float64 tensor on ``device`` (Triton would pass
    a Python float as float32), made once per capacity and device, not at every update, and
    kept: the CUDA graphs of updates read it where it was (:mod:`._priority_graphs`)."""
    return torch.full((1,), leaf_limit(capacity), dtype=torch.float64, device=device)


def kept_updates(state: PriorityState, index: torch.Tensor, priority: torch.Tensor,
                 alpha: float, eps: float, n_written: int | None, token: torch.Tensor | None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """``(target, kept_leaf, kept_priority)`` of ``n`` updates of ``state``'s slots ``index``
    to the float64 ``priority`` values (both, and the int64 ``token``, contiguous on the
    state's device, as :meth:`~._priority_kernels.TorchKernels.update` hands them), stored as
    ``leaf_values(priority, alpha, eps)``: ``target`` the slot, ``-1`` where the update is
    skipped (every one when a value is NaN, infinite, negative, or its stored value above
    ``leaf_limit(capacity)``; the slot out of range, not among the first ``n_written`` or
    unwritten; its write generation not ``token``'s);
    ``kept_leaf`` the stored value (``1.0`` where skipped); ``kept_priority`` the priority
    (``-inf`` where skipped). ``None`` where the kernels do not run on the state's device.
    """
    device = state.device
    if not runs_on(device):
        return None
    n = index.numel()
    leaf = leaf_values(priority, alpha, eps)
    target = torch.empty_like(index)
    kept_leaf = torch.empty_like(leaf)
    kept_priority = torch.empty_like(priority)
    if not n:
        return target, kept_leaf, kept_priority
    refused = torch.zeros(1, dtype=torch.int32, device=device)
    bound = _limit_on(state.capacity, device)
    tokens = index if token is None else token

    def launch() -> None:
        from ._priority_triton_kernels import find_refused, keep_updates

        grid = (-(-n // _BLOCK),)
        find_refused[grid](priority, leaf, bound, refused, n, BLOCK=_BLOCK)
        keep_updates[grid](index, priority, leaf, state.generation, tokens, refused, target,
                           kept_leaf, kept_priority, n, state.capacity,
                           state.capacity if n_written is None else n_written,
                           HAS_TOKEN=token is not None, BLOCK=_BLOCK)

    return (target, kept_leaf, kept_priority) if launched(device, launch) else None
