"""Shared fixtures of the tdreplay-storages tests: processes killed in the middle of a write to
a ``LazyMemmapStorage`` (the ``killed`` fixture, :class:`KilledWriters`)."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
from collections.abc import Callable
from typing import Any

import pytest
import torch

from tdreplay.storages._layout import TensorLayout


class KilledWriters:
    """Forked children that die (SIGKILL) in the middle of a write. The ``die_*`` methods patch
    the process they run in: call them in the child, which the patches die with."""

    @staticmethod
    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    def die_after_first_leaf(self) -> None:
        """From now on, a write of rows (``set``, ``extend``, a load) copies its first leaf,
        then the process dies."""
        die = self.die

        def copy_rows(layout, start, stop, src, shapes=None):
            layout.leaves[0][start:stop].copy_(src[0])
            die()

        def index_copy_rows(layout, index, src):
            layout.leaves[0].index_copy_(0, index, src[0].to(layout.leaves[0].dtype))
            die()

        TensorLayout.copy_rows = copy_rows  # type: ignore[method-assign]
        TensorLayout.index_copy_rows = index_copy_rows  # type: ignore[method-assign]

    def die_in_tensor_write(self, tensors: list[torch.Tensor] | None, after: int = 1,
                            half: bool = True) -> None:
        """From now on, the ``after``-th write (``copy_``, item assignment, ``index_copy_``)
        into the memory of ``tensors`` (a storage's entries; ``None``: into any tensor) is the
        last: the process dies once it is done, or once its first half of rows is written
        when ``half``."""
        memory = None if tensors is None else {t.untyped_storage().data_ptr() for t in tensors}
        die, writes = self.die, [0]
        real_copy, real_setitem = torch.Tensor.copy_, torch.Tensor.__setitem__
        real_index_copy = torch.Tensor.index_copy_

        def last(dest: torch.Tensor) -> bool:
            if memory is not None and dest.untyped_storage().data_ptr() not in memory:
                return False
            writes[0] += 1
            return writes[0] >= after

        def copy_(dest, src, *args, **kwargs):
            if last(dest):
                if half and dest.dim() and dest.shape[0] > 1:
                    n = dest.shape[0] // 2
                    real_copy(dest[:n], torch.broadcast_to(src, dest.shape)[:n])
                else:
                    real_copy(dest, src, *args, **kwargs)
                die()
            return real_copy(dest, src, *args, **kwargs)

        def setitem(dest, index, value):
            if last(dest):
                rows = _index_rows(index, dest.shape[0] if dest.dim() else 0)
                if half and rows is not None and rows.numel() > 1:
                    n = rows.numel() // 2
                    part = value
                    if isinstance(value, torch.Tensor) and value.dim() \
                            and value.shape[0] == rows.numel():
                        part = value[:n]
                    real_setitem(dest, rows[:n], part)
                else:
                    real_setitem(dest, index, value)
                die()
            return real_setitem(dest, index, value)

        def index_copy_(dest, dim, index, src):
            if last(dest):
                if half and dim == 0 and index.numel() > 1:
                    n = index.numel() // 2
                    real_index_copy(dest, 0, index[:n], src[:n])
                else:
                    real_index_copy(dest, dim, index, src)
                die()
            return real_index_copy(dest, dim, index, src)

        torch.Tensor.copy_ = copy_  # type: ignore[method-assign]
        torch.Tensor.__setitem__ = setitem  # type: ignore[method-assign, assignment]
        torch.Tensor.index_copy_ = index_copy_  # type: ignore[method-assign]

    @staticmethod
    def run(target: Callable[..., Any], *args: Any, timeout: float = 120) -> int | None:
        """``target(*args)`` in a forked child; its exit code."""
        p = mp.get_context("fork").Process(target=target, args=args)
        p.start()
        p.join(timeout)
        return p.exitcode

    def run_killed(self, target: Callable[..., Any], *args: Any) -> None:
        """``target(*args)`` in a forked child, which must die of SIGKILL."""
        assert self.run(target, *args) == -signal.SIGKILL


def _index_rows(index: Any, rows: int) -> torch.Tensor | None:
    """The rows a 1-D index (a slice, or int64 row numbers) selects, in order; else ``None``."""
    if isinstance(index, slice):
        return torch.arange(rows)[index]
    if isinstance(index, torch.Tensor) and index.dtype == torch.long and index.dim() == 1:
        return index
    return None


@pytest.fixture(scope="session")
def killed() -> KilledWriters:
    """Forked writers that die in the middle of a write (:class:`KilledWriters`)."""
    return KilledWriters()
