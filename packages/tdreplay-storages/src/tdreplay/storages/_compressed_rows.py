"""The rows of a :class:`~tdreplay.storages.CompressedListStorage` as plain data.

Shared by the storage (which makes and reads them) and its checkpointer (which saves and
rebuilds them), so that neither module imports the other.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import torch
from tensordict import is_tensorclass


class RowLayout(NamedTuple):
    """Structure of a compressed row: what is needed to rebuild it from its raw bytes.

    ``kind`` is ``"tensor"``, ``"tensordict"`` or ``"dict"``; ``batch_size`` the TensorDict's
    batch size (``()`` for a tensor or a dict); ``leaves`` one ``(key, dtype, shape)`` per
    leaf, in the order their bytes are concatenated (``key`` is ``None`` for a tensor row);
    ``classes`` the tensorclasses nested in a TensorDict row (``td["obs"]`` an ``Obs``), as
    ``(path, class)`` pairs, inner levels first, which the row is read back with (``()``:
    none); ``root`` the tensorclass of a row written as one (a TensorDict row read back as
    that class; ``None``: a TensorDict).

    Examples
    --------
    >>> RowLayout("tensor", (), ((None, torch.float32, (2, 3)),)).nbytes
    24
    >>> from tensordict import tensorclass
    >>> @tensorclass
    ... class Obs:
    ...     pos: torch.Tensor
    >>> RowLayout("tensordict", (), ((("obs", "pos"), torch.float32, (2,)),),
    ...           ((("obs",), Obs),)).classes[0][1].__name__
    'Obs'
    """

    kind: str
    batch_size: tuple[int, ...]
    leaves: tuple[tuple[Any, torch.dtype, tuple[int, ...]], ...]
    classes: tuple[tuple[tuple[str, ...], type], ...] = ()
    root: type | None = None

    @property
    def nbytes(self) -> int:
        """Bytes of one row uncompressed."""
        return _layout_nbytes(self)


@functools.cache
def itemsize(dtype: torch.dtype) -> int:
    """Bytes of one element of ``dtype``."""
    return torch.empty((), dtype=dtype).element_size()


@functools.lru_cache(maxsize=4096)
def _layout_nbytes(layout: RowLayout) -> int:
    return sum(math.prod(shape) * itemsize(dtype) for _, dtype, shape in layout.leaves)


class CompressedRow(NamedTuple):
    """One stored row: its layout and the compressed bytes of its leaves.

    Examples
    --------
    >>> row = CompressedRow(RowLayout("tensor", (), ((None, torch.uint8, (3,)),)), b"ab")
    >>> row.numel(), row.layout.nbytes
    (2, 3)
    """

    layout: RowLayout
    blob: bytes

    def numel(self) -> int:
        """Compressed bytes of the row, as the ``numel()`` of the ``uint8`` tensor TorchRL
        keeps for a compressed tensor."""
        return len(self.blob)


def _is_dims(value: Any) -> bool:
    return isinstance(value, tuple) and all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in value)


def _as_key(key: Any) -> tuple[str, ...] | None:
    if isinstance(key, str):
        return (key,)
    if isinstance(key, tuple) and key and all(isinstance(k, str) for k in key):
        return key
    return None


def layout_problem(layout: Any) -> str | None:
    """What makes ``layout`` unusable to rebuild a row (``None``: nothing): not a
    :class:`RowLayout`, an unknown ``kind``, a ``batch_size`` or leaf shape that is not a
    tuple of ints >= 0, a leaf that is not ``(key, dtype, shape)``, a tensor row without its
    one ``None``-keyed leaf, tensordict keys that are not nested keys or that clash (one
    inside another), nested tensorclasses that are not ``(path, tensorclass)`` pairs of a
    TensorDict row's nested levels.

    Examples
    --------
    >>> layout_problem(RowLayout("tensor", (), ((None, torch.float32, (2, 3)),))) is None
    True
    >>> layout_problem(RowLayout("tensordict", (), (("a", torch.int64, (2,)),
    ...                                             (("a", "b"), torch.int64, ()))))
    "leaf keys ('a', 'b') and ('a',) clash"
    """
    if not isinstance(layout, RowLayout):
        return f"the layout is a {type(layout).__name__}, not a RowLayout"
    if layout.kind not in ("tensor", "tensordict", "dict"):
        return f"kind {layout.kind!r} is not 'tensor', 'tensordict' or 'dict'"
    if layout.kind == "dict" and layout.batch_size != ():
        return "a dict row has no batch_size"
    if not _is_dims(layout.batch_size):
        return f"batch_size {layout.batch_size!r} is not a tuple of ints >= 0"
    if not isinstance(layout.leaves, tuple):
        return f"leaves {layout.leaves!r} is not a tuple"
    keys: list[tuple[str, ...]] = []
    for leaf in layout.leaves:
        if not isinstance(leaf, tuple) or len(leaf) != 3:
            return f"leaf {leaf!r} is not (key, dtype, shape)"
        key, dtype, shape = leaf
        if not isinstance(dtype, torch.dtype) or not _is_dims(shape):
            return f"leaf {leaf!r} has no torch dtype or no shape of ints >= 0"
        if layout.kind != "tensor":
            flat = _as_key(key)
            if flat is None:
                return f"leaf key {key!r} is not a str or a tuple of str"
            keys.append(flat)
    if layout.kind == "tensor" and (len(layout.leaves) != 1 or layout.leaves[0][0] is not None):
        return "a tensor row has one leaf, keyed None"
    keys.sort()
    for first, second in zip(keys, keys[1:]):
        if second[:len(first)] == first:
            return f"leaf keys {second!r} and {first!r} clash"
    return _classes_problem(layout, keys)


def _classes_problem(layout: RowLayout, keys: list[tuple[str, ...]]) -> str | None:
    """What makes ``layout.classes`` unusable (``None``: nothing); ``keys``: its leaf keys."""
    if layout.root is not None and (layout.kind != "tensordict"
                                    or not is_tensorclass(layout.root)):
        return f"root {layout.root!r} is not the tensorclass of a TensorDict row"
    classes = layout.classes
    if not isinstance(classes, tuple):
        return f"classes {classes!r} is not a tuple"
    if classes and layout.kind != "tensordict":
        return f"a {layout.kind} row has no nested tensorclasses"
    levels = {key[:depth] for key in keys for depth in range(1, len(key))}
    for pair in classes:
        if not (isinstance(pair, tuple) and len(pair) == 2 and _as_key(pair[0]) == pair[0]
                and is_tensorclass(pair[1])):
            return f"nested tensorclass {pair!r} is not (key path, tensorclass)"
        if pair[0] not in levels:
            return f"nested tensorclass {pair[1].__name__} is at {pair[0]!r}, not a nested level"
    return None
