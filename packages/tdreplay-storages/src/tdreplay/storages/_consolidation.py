"""``LazyTensorStorage(consolidated=True)``: which data a storage can consolidate.

A consolidated storage keeps every tensor of its TensorDict in one buffer (tensordict's
``consolidate()``, done once, when the storage is laid out by its first write; see
:meth:`~tdreplay.storages._layout.TensorLayout.consolidate`). As TorchRL's, only tensor
collections (TensorDicts, tensorclasses) are consolidated: other data is refused.
"""

from __future__ import annotations

from ._formats import KIND_LAZY_STACK, KIND_TC, KIND_TD

__all__ = ["check_consolidable"]

#: the kinds of data (:mod:`~tdreplay.storages._formats`) a consolidated storage holds
CONSOLIDABLE_KINDS = (KIND_TD, KIND_TC, KIND_LAZY_STACK)


def check_consolidable(kind: str) -> None:
    """``ValueError`` (TorchRL's) unless data of ``kind`` can be consolidated.

    Examples
    --------
    >>> check_consolidable("tensordict")
    >>> check_consolidable("tensor")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: Cannot consolidate non-tensordict storages: consolidated=True needs ...
    """
    if kind not in CONSOLIDABLE_KINDS:
        raise ValueError(f"Cannot consolidate non-tensordict storages: consolidated=True needs "
                         f"TensorDict or tensorclass data, got {kind} data (nothing was "
                         "written; build the storage with consolidated=False).")
