"""Unchecked TensorDict construction and grouped leaf copies for the storages' hot paths.

A tensor storage builds a TensorDict on every read (a sample of 256 rows builds one per nesting
level) from leaves it has just cut out of its own layout: their batch dims, device and keys are
right by construction. tensordict's public constructor checks them all again; its unchecked
constructor (the one tensordict's own indexing uses) does not. Measured on tensordict 0.15.3,
one torch thread, a two-level TensorDict of five leaves of 256 rows: 7.2 us public, 1.8 us
unchecked (``ReplayBuffer.sample(256)`` spends the difference on every call). Likewise a write
copies every leaf of a row: one grouped ``torch._foreach_copy_`` dispatch instead of one
``copy_`` per leaf.

Neither has a public equivalent in tensordict 0.15 / torch 2.13, so both are used behind a probe:
at import, each is run once on a small example and its result compared with the public path's.
If a tensordict or torch release renames or changes them, the probe fails and the public path is
used instead: slower, the same result. Nothing else in tdreplay touches these names.

Examples
--------
>>> import torch
>>> td = new_tensordict({"a": torch.zeros(3, 2)}, torch.Size([3]), None)
>>> td.batch_size, td["a"].shape
(torch.Size([3]), torch.Size([3, 2]))
>>> dst = [torch.zeros(2), torch.zeros(3, dtype=torch.int64)]
>>> copy_leaves(dst, [torch.ones(2), torch.arange(3)])
>>> dst[1].tolist()
[0, 1, 2]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from tensordict import TensorDict

__all__ = ["copy_leaves", "fast_paths_in_use", "new_tensordict"]

_Constructor = Callable[..., TensorDict]
_GroupedCopy = Callable[[Sequence[torch.Tensor], Sequence[torch.Tensor]], None]


def _public_constructor(source: dict[str, Any], batch_size: torch.Size,
                        device: torch.device | None) -> TensorDict:
    # non_blocking=False: the leaves are already on ``device`` (no transfer to wait for)
    return TensorDict(source, batch_size=batch_size, device=device, non_blocking=False)


def _public_copy(dst: Sequence[torch.Tensor], src: Sequence[torch.Tensor]) -> None:
    for d, s in zip(dst, src):
        d.copy_(s)


def _probed_constructor() -> _Constructor | None:
    """tensordict's unchecked constructor when it builds what the public one builds, else None."""
    unchecked = getattr(TensorDict, "_new_unsafe", None)  # tensordict's own fast path
    if unchecked is None:
        return None
    leaves = {"a": torch.arange(6.0).reshape(3, 2), "b": torch.arange(3)}
    size = torch.Size([3])
    try:
        inner = unchecked(source=dict(leaves), batch_size=size, device=None, nested=False)
        probe = unchecked(source={"n": inner, "c": leaves["b"]}, batch_size=size, device=None,
                          nested=False)
    except Exception:  # any failure: a changed signature, the public path serves
        return None
    expected = _public_constructor({"n": _public_constructor(dict(leaves), size, None),
                                    "c": leaves["b"]}, size, None)
    if (type(probe) is not TensorDict or probe.batch_size != size or probe.device is not None
            or set(probe.keys(True, True)) != set(expected.keys(True, True))
            or not (probe == expected).all()):
        return None
    return unchecked


def _probed_grouped_copy() -> _GroupedCopy | None:
    """torch's grouped copy when it copies (with dtype casts) as ``copy_`` does, else None."""
    grouped = getattr(torch, "_foreach_copy_", None)
    if grouped is None:
        return None
    dst = [torch.zeros(2, 3), torch.zeros(4, dtype=torch.int64)]
    src = [torch.arange(6.0).reshape(2, 3), torch.arange(4, dtype=torch.int32)]
    try:
        grouped(dst, src)
    except Exception:  # any failure: a changed signature, the public path serves
        return None
    if not all(torch.equal(d, s.to(d.dtype)) for d, s in zip(dst, src)):
        return None
    return grouped


_UNCHECKED = _probed_constructor()
_GROUPED = _probed_grouped_copy()


def fast_paths_in_use() -> tuple[bool, bool]:
    """``(unchecked constructor, grouped copy)``: which fast paths passed their probe."""
    return _UNCHECKED is not None, _GROUPED is not None


def new_tensordict(source: dict[str, Any], batch_size: torch.Size,
                   device: torch.device | None) -> TensorDict:
    """A TensorDict of ``source`` without checking it: the caller guarantees that every value is
    a tensor or TensorDict (never a dict) whose leading dims are ``batch_size``, on ``device``."""
    if _UNCHECKED is None:
        return _public_constructor(source, batch_size, device)
    # nested=False: the values are taken as they are (no per-value check for a nested dict)
    return _UNCHECKED(source=source, batch_size=batch_size, device=device, nested=False)


def copy_leaves(dst: Sequence[torch.Tensor], src: Sequence[torch.Tensor]) -> None:
    """``dst[i].copy_(src[i])`` for every ``i`` (casts and broadcasts as ``copy_``), grouped
    into one dispatch when torch offers it."""
    if _GROUPED is None or len(dst) < 2:
        _public_copy(dst, src)
    else:
        _GROUPED(dst, src)
