"""Sum and min segment trees for prioritized sampling, with a numba and a torch backend.

Design
------
:class:`SumTree` and :class:`MinTree` are the interfaces; :func:`make_sum_tree` and
:func:`make_min_tree` build a tree of the backend chosen by ``backend`` (and ``device``).
``SumSegmentTree(...)`` / ``MinSegmentTree(...)`` call them (TorchRL's spelling) and every
backend class counts as their subclass:

=========================  =====================  ======================================
class                      backend                inputs / outputs
=========================  =====================  ======================================
:class:`NumbaSumTree`      ``"numba"`` (CPU)      numpy arrays (tensors accepted) / numpy
:class:`NumbaMinTree`      ``"numba"`` (CPU)      same
:class:`TorchSumTree`      ``"torch"`` (any dev)  tensors (numpy accepted) / tensors
:class:`TorchMinTree`      ``"torch"`` (any dev)  same
=========================  =====================  ======================================

:class:`MinOverSumTree` (:func:`make_min_over_sum`; :class:`NumbaMinOverSumTree`,
:class:`TorchMinOverSumTree`) is the least positive leaf of a sum tree, kept by the internal
nodes of a min tree whose leaf level is the sum tree's (about 1/7 of the memory of a
:class:`MinTree`): what a prioritized sampler needs for its importance weights.

Modules: ``_layout`` (node layout), ``_base`` (interfaces), ``_memory`` (aligned host arrays
on huge pages), ``_numba_kernels`` (the numba kernels, pure functions over a node array),
``_numba`` and ``_torch`` (the backends) and ``_factory`` (the backend choice); each imports
only those before it.

Both backends share one flat float64 layout, :class:`TreeLayout`: an 8-ary tree whose nodes
keep their 8 children side by side (one 64-byte cache line), root at position 0, leaf ``i`` at
``leaf_offset + i``. They perform the same IEEE operations in the same order (a node's sum is
``((c0 + c1) + (c2 + c3)) + ((c4 + c5) + (c6 + c7))``) and therefore give identical sums,
minima and scan results. Updates recompute ancestors from their children (no accumulated
drift); :meth:`~SegmentTree.rebuild` recomputes every internal node in O(capacity);
``state_dict()`` holds ``capacity`` and the leaf values as a CPU float64 tensor and loads into
either backend.

Examples
--------
>>> import numpy as np
>>> from tdreplay.samplers.segment_trees import SumSegmentTree, MinSegmentTree
>>> s = SumSegmentTree(8)
>>> type(s).__name__, isinstance(s, SumSegmentTree)
('NumbaSumTree', True)
>>> s.update(np.arange(4), np.array([1.0, 0.0, 2.0, 1.0]))
>>> s.scan_lower_bound(np.array([0.0, 1.0, 2.5, 3.99]))
array([0, 2, 2, 3])
>>> t = SumSegmentTree(8, backend="torch")
>>> t.load_state_dict(s.state_dict())
>>> float(t.total()) == s.total()
True
"""

from ._base import MinOverSumTree, MinTree, SegmentTree, SumTree
from ._factory import (
    BACKENDS,
    MinSegmentTree,
    SumSegmentTree,
    make_min_over_sum,
    make_min_tree,
    make_sum_tree,
    resolve_backend,
)
from ._layout import FANOUT, TreeLayout
from ._numba import NumbaMinOverSumTree, NumbaMinTree, NumbaSumTree
from ._torch import TorchMinOverSumTree, TorchMinTree, TorchSumTree

__all__ = [
    "BACKENDS",
    "FANOUT",
    "MinOverSumTree",
    "MinSegmentTree",
    "MinTree",
    "NumbaMinOverSumTree",
    "NumbaMinTree",
    "NumbaSumTree",
    "SegmentTree",
    "SumSegmentTree",
    "SumTree",
    "TorchMinOverSumTree",
    "TorchMinTree",
    "TorchSumTree",
    "TreeLayout",
    "make_min_over_sum",
    "make_min_tree",
    "make_sum_tree",
    "resolve_backend",
]
