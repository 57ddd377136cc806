"""Compressed rows as plain values: what a :class:`~tdreplay.storages.CompressedListStorage`
checkpoint holds without a class of its own.

A checkpoint written by ``dumps`` keeps the structures of its rows in JSON and their bytes in
files; a ``state_dict`` keeps them as tensors, lists, str and int, so that ``torch.load``
reads it with ``weights_only=True`` (torch's default), as it reads every other storage's.
:func:`layout_record` / :func:`layout_from_record` write and read one structure (both forms
share them); :func:`rows_record` / :func:`rows_from_record` a list of rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ._compressed_rows import CompressedRow, RowLayout
from ._formats import hold_tensorclass, resolve_tensorclass
from ._layout import as_key, dtype_from_str, key_path
from ._tensorclasses import classes_from_record, classes_record, inner_first

__all__ = ["layout_from_record", "layout_record", "rows_from_record", "rows_record"]


def layout_record(layout: RowLayout) -> dict[str, Any]:
    """``layout`` as JSON values: its kind, batch size, leaves (key, dtype, shape) and the
    tensorclasses nested in it (absent: none).

    Examples
    --------
    >>> record = layout_record(RowLayout("tensordict", (2,), ((("a", "b"), torch.int64, (2,)),)))
    >>> record["kind"], record["batch_size"], record["leaves"][0]["key"]
    ('tensordict', [2], ['a', 'b'])
    >>> layout_from_record(record).leaves
    ((('a', 'b'), torch.int64, (2,)),)
    """
    return {"kind": layout.kind, "batch_size": list(layout.batch_size),
            "leaves": [{"key": None if key is None else list(key_path(key)),
                        "dtype": str(dtype), "shape": list(shape)}
                       for key, dtype, shape in layout.leaves],
            # where the tensorclasses nested in the rows are defined (absent: none)
            **({"tensorclasses": classes_record(dict(layout.classes))}
               if layout.classes else {}),
            # the tensorclass of rows written as one (absent: TensorDict rows)
            **({"tensorclass": hold_tensorclass(layout.root)}
               if layout.root is not None else {})}


def layout_from_record(info: dict[str, Any]) -> RowLayout:
    """The :class:`RowLayout` :func:`layout_record` wrote (``KeyError``, ``TypeError`` or
    ``ValueError`` for a damaged record; ``CheckpointError`` for a tensorclass not found)."""
    return RowLayout(info["kind"], tuple(info["batch_size"]), tuple(
        (None if leaf["key"] is None else as_key(leaf["key"]), dtype_from_str(leaf["dtype"]),
         tuple(leaf["shape"]))
        for leaf in info["leaves"]),
        inner_first(classes_from_record(info.get("tensorclasses"))),
        None if info.get("tensorclass") is None else resolve_tensorclass(info["tensorclass"]))


def rows_record(rows: Sequence[CompressedRow]) -> dict[str, Any]:
    """``rows`` as tensors and JSON values: ``blobs`` (every row's bytes back to back, uint8),
    ``offsets`` (int64, where each starts, ``len + 1`` values), ``row_layouts`` (int64, the
    structure of each) and ``layouts`` (the structures, as :func:`layout_record` writes them).

    Examples
    --------
    >>> layout = RowLayout("tensor", (), ((None, torch.uint8, (3,)),))
    >>> record = rows_record([CompressedRow(layout, b"ab"), CompressedRow(layout, b"c")])
    >>> record["offsets"].tolist(), record["row_layouts"].tolist(), len(record["layouts"])
    ([0, 2, 3], [0, 0], 1)
    >>> [row.blob for row in rows_from_record(record)]
    [b'ab', b'c']
    """
    layouts: dict[RowLayout, int] = {}
    row_layouts = [layouts.setdefault(row.layout, len(layouts)) for row in rows]
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum([len(row.blob) for row in rows], out=offsets[1:])
    blobs = b"".join(row.blob for row in rows)
    return {"blobs": torch.frombuffer(bytearray(blobs), dtype=torch.uint8) if blobs
            else torch.zeros(0, dtype=torch.uint8),
            "offsets": torch.from_numpy(offsets),
            "row_layouts": torch.tensor(row_layouts, dtype=torch.int64),
            "layouts": [layout_record(layout) for layout in layouts]}


def rows_from_record(record: Any) -> list[CompressedRow]:
    """The rows :func:`rows_record` wrote, rows of one structure sharing one layout object;
    ``ValueError`` naming what does not fit (the offsets and the bytes, a structure that is
    not in the table, a damaged structure)."""
    try:
        blobs, offsets = record["blobs"], record["offsets"]
        row_layouts, infos = record["row_layouts"], record["layouts"]
        layouts = [layout_from_record(info) for info in infos]
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise ValueError(f"the rows record is damaged ({type(err).__name__}: {err}).") from err
    if not all(isinstance(t, torch.Tensor) for t in (blobs, offsets, row_layouts)):
        raise ValueError("the rows record needs 'blobs', 'offsets' and 'row_layouts' tensors.")
    n = row_layouts.numel()
    ends = offsets.tolist()
    if (blobs.dtype is not torch.uint8 or offsets.shape != (n + 1,) or not ends or ends[0] != 0
            or ends[-1] != blobs.numel() or any(b < a for a, b in zip(ends, ends[1:]))):
        raise ValueError("the rows record's offsets do not match its bytes.")
    kinds = row_layouts.tolist()
    if n and (min(kinds) < 0 or max(kinds) >= len(layouts)):
        raise ValueError("the rows record names structures that are not in its table.")
    data = blobs.numpy().tobytes()
    return [CompressedRow(layouts[kinds[i]], data[ends[i]:ends[i + 1]]) for i in range(n)]
