"""Sum and min segment trees for prioritized sampling, with a numba and a torch backend.

Design
------
:class:`SumSegmentTree` and :class:`MinSegmentTree` are the interface. Calling one of them
returns an instance of a concrete backend class, chosen by ``backend`` (and ``device``):

=========================  =====================  ======================================
class                      backend                inputs / outputs
=========================  =====================  ======================================
:class:`NumbaSumTree`      ``"numba"`` (CPU)      numpy arrays (tensors accepted) / numpy
:class:`NumbaMinTree`      ``"numba"`` (CPU)      same
:class:`TorchSumTree`      ``"torch"`` (any dev)  tensors (numpy accepted) / tensors
:class:`TorchMinTree`      ``"torch"`` (any dev)  same
=========================  =====================  ======================================

Both backends share one flat float64 layout (root at node 1, leaf ``i`` at node ``P + i`` with
``P`` the next power of two ``>= capacity``), perform the same IEEE operations in the same order
and therefore give identical sums, minima and scan results. Updates recompute ancestors from
their children (no accumulated drift); :meth:`~SegmentTree.rebuild` recomputes every internal
node in O(capacity); ``state_dict()`` holds ``capacity`` and the leaf values as a CPU float64
tensor and loads into either backend.

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

from ._base import BACKENDS, MinSegmentTree, SegmentTree, SumSegmentTree
from ._numba import NumbaMinTree, NumbaSumTree
from ._torch import TorchMinTree, TorchSumTree

__all__ = [
    "BACKENDS",
    "MinSegmentTree",
    "NumbaMinTree",
    "NumbaSumTree",
    "SegmentTree",
    "SumSegmentTree",
    "TorchMinTree",
    "TorchSumTree",
]
