"""Choosing a segment-tree backend: :func:`make_sum_tree`, :func:`make_min_tree`,
:func:`make_min_over_sum`.

This is the one place that knows every backend. The interfaces (:mod:`._base`) import no
backend; the backends (:mod:`._numba`, :mod:`._torch`) import only the interfaces.
:class:`SumSegmentTree` and :class:`MinSegmentTree` keep the TorchRL-style spelling
``SumSegmentTree(capacity, ...)``: calling them calls the factory, and every backend tree is
registered as one of their (virtual) subclasses, so ``isinstance`` checks work.
"""

from __future__ import annotations

from typing import cast

import torch

from ._base import MinOverSumTree, MinTree, SumTree
from ._numba import NumbaMinOverSumTree, NumbaMinTree, NumbaSumTree
from ._torch import TorchMinOverSumTree, TorchMinTree, TorchSumTree

__all__ = [
    "BACKENDS",
    "MinSegmentTree",
    "SumSegmentTree",
    "make_min_over_sum",
    "make_min_tree",
    "make_sum_tree",
    "resolve_backend",
]

#: Names accepted by the ``backend`` argument.
BACKENDS: tuple[str, ...] = ("numba", "torch")

DeviceLike = torch.device | str | None


def resolve_backend(backend: str | None, device: DeviceLike) -> str:
    """The backend a tree on ``device`` gets: ``backend`` if given, else numba on CPU.

    Examples
    --------
    >>> resolve_backend(None, None), resolve_backend(None, "cuda"), resolve_backend("torch", None)
    ('numba', 'torch', 'torch')
    """
    if backend is None:
        if device is None or torch.device(device).type == "cpu":
            return "numba"
        return "torch"
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS} or None, got {backend!r}")
    return backend


def make_sum_tree(capacity: int, *, backend: str | None = None, device: DeviceLike = None,
                  validate: bool | None = None) -> SumTree:
    """A sum tree of ``capacity`` leaves of the backend ``backend`` (or the one ``device`` gets).

    Parameters
    ----------
    capacity : int
        Number of leaves, ``> 0``.
    backend : {"numba", "torch", None}, optional
        ``"numba"``: CPU tree with numba kernels, takes and returns numpy arrays.
        ``"torch"``: tree in a torch tensor on ``device``, takes and returns tensors.
        ``None`` (default): ``"numba"`` if ``device`` is ``None`` or a CPU device, else ``"torch"``.
    device : torch.device or str, optional
        Device of the torch tree (default CPU). The numba tree only accepts CPU.
    validate : bool, optional
        Torch backend only: check that indices are in range (raising ``IndexError``) and that the
        tree is non-empty before ``scan_lower_bound``. Checking needs the values on the host,
        so it defaults to ``True`` on CPU and ``False`` on other devices, where out-of-range
        indices are ignored by ``update`` and read as the empty-leaf value by ``get``,
        without a host sync. The numba backend always validates.

    Examples
    --------
    >>> import numpy as np
    >>> tree = make_sum_tree(5)
    >>> type(tree).__name__
    'NumbaSumTree'
    >>> tree.update(np.array([0, 2, 4]), np.array([1.0, 2.0, 3.0]))
    >>> tree.total(), tree.query(1, 4)
    (6.0, 2.0)
    >>> tree.scan_lower_bound(np.array([0.5, 1.0, 2.9, 3.0, 100.0]))
    array([0, 2, 2, 4, 4])
    >>> ttree = make_sum_tree(5, backend="torch")
    >>> ttree.load_state_dict(tree.state_dict())
    >>> ttree.scan_lower_bound(torch.tensor([0.5, 2.9, 3.0]))
    tensor([0, 2, 4])
    """
    if resolve_backend(backend, device) == "numba":
        return NumbaSumTree(capacity, device=device, validate=validate)
    return TorchSumTree(capacity, device=device, validate=validate)


def make_min_tree(capacity: int, *, backend: str | None = None, device: DeviceLike = None,
                  validate: bool | None = None) -> MinTree:
    """A min tree of ``capacity`` leaves; the arguments are those of :func:`make_sum_tree`.

    Examples
    --------
    >>> import numpy as np
    >>> tree = make_min_tree(4)
    >>> tree.min()
    inf
    >>> tree.update(np.array([1, 3]), np.array([5.0, 2.0]))
    >>> tree.min(), tree.query(0, 2)
    (2.0, 5.0)
    >>> tree[np.array([0, 1])]
    array([inf,  5.])
    """
    if resolve_backend(backend, device) == "numba":
        return NumbaMinTree(capacity, device=device, validate=validate)
    return TorchMinTree(capacity, device=device, validate=validate)


def make_min_over_sum(sum_tree: SumTree) -> MinOverSumTree:
    """The least positive leaf of ``sum_tree``, kept by a min tree without leaves of its own
    (see :class:`~._base.MinOverSumTree`), of the backend of ``sum_tree``.

    Examples
    --------
    >>> import numpy as np
    >>> sums = make_sum_tree(1000)
    >>> mins = make_min_over_sum(sums)
    >>> sums.update(np.array([5, 900]), np.array([3.0, 0.25]))
    >>> mins.refresh(np.array([5, 900]))
    >>> type(mins).__name__, mins.min(), mins.nodes.nbytes, make_min_tree(1000).nodes.nbytes
    ('NumbaMinOverSumTree', 0.25, 1280, 9472)
    """
    if isinstance(sum_tree, NumbaSumTree):
        return NumbaMinOverSumTree(sum_tree)
    if isinstance(sum_tree, TorchSumTree):
        return TorchMinOverSumTree(sum_tree)
    raise TypeError(f"sum_tree must be a NumbaSumTree or a TorchSumTree, got "
                    f"{type(sum_tree).__name__}")


class SumSegmentTree(SumTree):
    """Sum segment tree over ``capacity`` float64 leaves (empty leaves are ``0``).

    ``SumSegmentTree(capacity, backend=..., device=..., validate=...)`` is
    :func:`make_sum_tree`: it returns a :class:`~._numba.NumbaSumTree` or a
    :class:`~._torch.TorchSumTree`, both registered as subclasses of this class.

    Examples
    --------
    >>> tree = SumSegmentTree(8)
    >>> type(tree).__name__, isinstance(tree, SumSegmentTree)
    ('NumbaSumTree', True)
    >>> isinstance(SumSegmentTree(8, backend="torch"), SumSegmentTree)
    True
    """

    def __new__(cls, capacity: int, *, backend: str | None = None, device: DeviceLike = None,
                validate: bool | None = None) -> SumSegmentTree:
        # a registered virtual subclass: isinstance(tree, SumSegmentTree) holds
        return cast(SumSegmentTree, make_sum_tree(capacity, backend=backend, device=device,
                                                  validate=validate))


class MinSegmentTree(MinTree):
    """Min segment tree over ``capacity`` float64 leaves (empty leaves are ``+inf``).

    ``MinSegmentTree(capacity, backend=..., device=..., validate=...)`` is
    :func:`make_min_tree`: it returns a :class:`~._numba.NumbaMinTree` or a
    :class:`~._torch.TorchMinTree`, both registered as subclasses of this class.

    Examples
    --------
    >>> tree = MinSegmentTree(4, backend="torch")
    >>> type(tree).__name__, isinstance(tree, MinSegmentTree)
    ('TorchMinTree', True)
    """

    def __new__(cls, capacity: int, *, backend: str | None = None, device: DeviceLike = None,
                validate: bool | None = None) -> MinSegmentTree:
        return cast(MinSegmentTree, make_min_tree(capacity, backend=backend, device=device,
                                                  validate=validate))


for _sum_cls in (NumbaSumTree, TorchSumTree):
    SumSegmentTree.register(_sum_cls)
for _min_cls in (NumbaMinTree, TorchMinTree):
    MinSegmentTree.register(_min_cls)
