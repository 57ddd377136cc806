"""The rows of a :class:`~tdreplay.storages.CompressedListStorage` as plain data.

Shared by the storage (which makes and reads them) and its checkpointer (which saves and
rebuilds them), so that neither module imports the other.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import torch


class RowLayout(NamedTuple):
    """Structure of a compressed row: what is needed to rebuild it from its raw bytes.

    ``kind`` is ``"tensor"`` or ``"tensordict"``; ``batch_size`` the TensorDict's batch size
    (``()`` for a tensor); ``leaves`` one ``(key, dtype, shape)`` per leaf, in the order their
    bytes are concatenated (``key`` is ``None`` for a tensor row).

    Examples
    --------
    >>> RowLayout("tensor", (), ((None, torch.float32, (2, 3)),)).nbytes
    24
    """

    kind: str
    batch_size: tuple[int, ...]
    leaves: tuple[tuple[Any, torch.dtype, tuple[int, ...]], ...]

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
