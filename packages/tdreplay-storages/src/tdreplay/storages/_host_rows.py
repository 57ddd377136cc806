"""``HostRows``: reads rows out of a storage's leaves at given slots (the sample path) and
writes runs of rows into them (the extend path), through numpy views of the CPU leaves.

On the CPU, ``numpy.take`` along the first axis copies whole rows where ``torch.index_select``
walks them element by element; measured on this project's transition rows (1M slots, one torch
thread, CPU us per call): 4,096 rows of a 4-float leaf 150 -> 64, of a 1-float leaf 77 -> 24,
of a 32-float leaf 226 -> 169; 256 rows of a 4-float leaf 16.9 -> 12.6. ``numpy.take``
runs on one thread, so a gather large enough for torch to split over its threads
(:data:`PARALLEL_GRAIN` elements, and more than one thread) stays with ``index_select``, as does
every leaf numpy has no dtype for (``bfloat16``, ...), every leaf off the CPU, and anything
``torch.compile`` traces. Both give the same values, dtype and shape; the result is an ordinary
tensor that owns its memory either way.

The gather calls the array's ``take`` method: the ``numpy.take`` function dispatches to it at a
cost of 2-3 us per leaf (``sample(256)`` of two leaves: 7.8-10.5 -> 5.1 us).

Writes: a slice assignment to a numpy view costs less per leaf than torch's slice view and its
``copy_``. Measured on this project's transition rows (six leaves, 1,000 rows, one torch thread):
torch slice views and one grouped ``copy_`` 53.6 us, numpy views 48.6 us with the sources'
conversions. A source numpy cannot see (off the CPU, ``requires_grad``, a dtype numpy lacks)
or of another dtype than its leaf leaves the write to torch: :meth:`HostRows.put` says so.

A numpy view is checked against its leaf's data pointer before each use: a leaf whose memory
moved (``share_memory_()``, which torch also calls when a tensor is sent to another process)
gets a new view, never a read of the memory it left.

Examples
--------
>>> import torch
>>> rows = HostRows([torch.arange(10).reshape(5, 2), torch.arange(5.0)])
>>> [x.tolist() for x in rows.take(torch.tensor([4, 0]))]
[[[8, 9], [0, 1]], [4.0, 0.0]]
>>> rows.put(1, 3, [torch.full((2, 2), -1), torch.tensor([7.0, 8.0])])
True
>>> [x.tolist() for x in rows.take(torch.tensor([1, 2]))]
[[[-1, -1], [-1, -1]], [7.0, 8.0]]
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat

import numpy as np
import torch

__all__ = ["PARALLEL_GRAIN", "HostRows"]

_data_ptr = torch.Tensor.data_ptr

#: torch's intra-op grain (``at::internal::GRAIN_SIZE``): ops on fewer elements run on one
#: thread, so numpy's single-threaded take loses nothing below it.
PARALLEL_GRAIN = 32768


def _host_view(leaf: torch.Tensor) -> np.ndarray | None:
    """A numpy view of ``leaf`` (same memory), or None where numpy cannot see it."""
    if leaf.device.type != "cpu" or leaf.requires_grad or leaf.ndim == 0:
        return None
    try:
        return leaf.detach().numpy()
    except (TypeError, RuntimeError):  # a dtype numpy lacks (bfloat16, float8, ...)
        return None


class HostRows:
    """Row reads from and writes to ``leaves`` (tensors sharing their first dimension, the
    slots)."""

    def __init__(self, leaves: Sequence[torch.Tensor]) -> None:
        self.leaves = list(leaves)
        #: elements per row of each leaf (a gather of ``n`` rows copies ``n`` times as many)
        self.row_numel = [leaf[0].numel() if leaf.shape[0] else 0 for leaf in self.leaves]
        self._make_views()

    def _make_views(self) -> None:
        self.host = [_host_view(leaf) for leaf in self.leaves]
        #: where each leaf's memory was when its view was made
        self.pointers = [leaf.data_ptr() for leaf in self.leaves]
        #: the views of all leaves when numpy sees every one (one thread reads them all with
        #: ``take``: the lean path), else None
        views = [host for host in self.host if host is not None]
        self.all_views = views if len(views) == len(self.host) else None

    def _follow_moves(self) -> None:
        """New views for leaves whose memory moved since their views were made."""
        if list(map(_data_ptr, self.leaves)) != self.pointers:
            self._make_views()

    def take(self, slots: torch.Tensor) -> list[torch.Tensor]:
        """The rows at ``slots`` (a 1-D int64 tensor on the leaves' device, unchecked) of
        every leaf, in order."""
        if not slots.is_cpu or torch.compiler.is_compiling():
            return [torch.index_select(leaf, 0, slots) for leaf in self.leaves]
        self._follow_moves()
        index = slots.numpy()
        one_thread = torch.get_num_threads() == 1
        views = self.all_views
        if one_thread and views is not None:
            return [torch.from_numpy(view.take(index, 0)) for view in views]
        n = slots.shape[0]
        return [torch.from_numpy(host.take(index, 0))
                if host is not None and (one_thread or n * numel < PARALLEL_GRAIN)
                else torch.index_select(leaf, 0, slots)
                for leaf, host, numel in zip(self.leaves, self.host, self.row_numel)]

    def put(self, start: int, stop: int, sources: Sequence[torch.Tensor],
            shapes: Sequence[tuple[int, ...]] | None = None) -> bool:
        """Copy ``sources`` (one per leaf, of its dtype, whose leading dims hold the
        ``stop - start`` slots, or one slot's item without a leading dim) into slots
        ``[start, stop)`` of every leaf, through the numpy views. Returns ``False``, having
        written nothing, where a leaf or a source has no view of the same dtype: the caller
        then copies with torch.

        ``shapes``: the sources are unchecked, and each must have exactly its shape in
        ``shapes`` (never broadcast): ``False``, nothing written, otherwise (the caller then
        checks them and names what differs). Read from the numpy arrays the write makes
        anyway, this check costs less than one of the tensors' shapes.
        """
        if self.all_views is None:  # (a leaf numpy cannot see: no move changes that)
            return False
        self._follow_moves()
        views = self.all_views
        assert views is not None
        arrays = []
        try:  # (one loop, no list comprehension or generator: each is a call more)
            for source, view, shape in zip(sources, views, shapes or repeat(None)):
                array = source.numpy()
                if array.dtype != view.dtype or shape is not None and array.shape != shape:
                    return False
                if array.ndim > view.ndim:  # a storage of several dims: its rows' slots in one
                    array = array.reshape(stop - start, *view.shape[1:])
                arrays.append(array)
        # off the CPU, requires_grad, a dtype numpy lacks; an unchecked source of other slots
        except (TypeError, RuntimeError, ValueError):
            return False
        for view, array in zip(views, arrays):  # (nothing is written before all convert)
            view[start:stop] = array
        return True
