"""Which codec compressed a checkpoint's rows, told by what they decompress to.

A custom codec is named by its function's ``__qualname__`` only: two lambdas, or two scripts
that each define ``compress``, share a name, and rows of one read with the other decompress to
other bytes of the same size, which no size check sees. So a checkpoint records, for the first
row of each layout, the CRC-32 of the bytes it decompresses to (:func:`row_checksums`); a
storage loading it decompresses those rows with its own codec and refuses the checkpoint when
one differs (:func:`check_row_checksums`). The CRC-32 of every row's compressed bytes
(:func:`blob_checksums`) is recorded too: a state whose bytes were damaged is refused whole
when it is loaded (:func:`check_blob_checksums`), not row by row as the rows are read.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any, Protocol

import torch

from ._compressed_rows import CompressedRow, RowLayout
from ._leaf_codec import DecompressionFnError

__all__ = ["RowCodec", "blob_checksums", "check_blob_checksums", "check_round_trip",
           "check_row_checksums", "raw_row", "row_checksums"]

#: rows checked at most (the first of each layout, in row order)
MAX_CHECKED = 16


class RowCodec(Protocol):
    """What the checks need of a codec: its name and :meth:`decompress_row`."""

    @property
    def name(self) -> str: ...

    def decompress_row(self, blob: bytes, layout: RowLayout) -> bytes: ...


def row_checksums(rows: Sequence[CompressedRow], codec: RowCodec) -> list[list[int]]:
    """``[[row, CRC-32 of its decompressed bytes]]`` for the first row of each layout (at most
    :data:`MAX_CHECKED`).

    Examples
    --------
    >>> from tdreplay.storages import CompressedListStorage
    >>> import torch
    >>> s = CompressedListStorage(4)
    >>> s.set(torch.arange(2), torch.zeros(2, 3))
    >>> row_checksums(s.items(), s.codec) == [[0, zlib.crc32(bytes(12))]]
    True
    """
    checked: list[list[int]] = []
    seen: set[int] = set()
    for i, row in enumerate(rows):
        if id(row.layout) in seen:
            continue
        seen.add(id(row.layout))
        checked.append([i, zlib.crc32(codec.decompress_row(row.blob, row.layout))])
        if len(checked) == MAX_CHECKED:
            break
    return checked


def check_row_checksums(rows: Sequence[CompressedRow], codec: RowCodec, checksums: Any,
                        name: str) -> None:
    """``ValueError`` unless each ``[row, crc]`` of ``checksums`` (``None``: a checkpoint saved
    before they were recorded, not checked) names a row of ``rows`` that ``codec``
    decompresses to bytes of that CRC-32; ``name`` is the entry's, for the message.

    Examples
    --------
    >>> from tdreplay.storages import CompressedListStorage
    >>> import torch
    >>> s = CompressedListStorage(4)
    >>> s.set(torch.arange(2), torch.ones(2, 3))
    >>> check_row_checksums(s.items(), s.codec, [[0, 1234]], "row_crc")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: row 0 decompresses to other bytes than it was saved from: this storage's ...
    """
    if checksums is None:
        return
    if not isinstance(checksums, (list, tuple)) or not all(
            isinstance(pair, (list, tuple)) and len(pair) == 2
            and all(type(x) is int for x in pair) and 0 <= pair[0] < len(rows)
            for pair in checksums):
        raise ValueError(f"{name} must be a list of [row, crc32] pairs naming rows of the "
                         f"checkpoint, got {checksums!r:.200}.")
    for i, crc in checksums:
        row = rows[i]
        try:
            raw = codec.decompress_row(row.blob, row.layout)
        except Exception as err:  # any codec failure: this codec did not compress the row
            raise ValueError(f"row {i} does not decompress with the codec {codec.name!r} "
                             f"({type(err).__name__}: {err}).") from err
        if zlib.crc32(raw) != crc:
            raise ValueError(
                f"row {i} decompresses to other bytes than it was saved from: this storage's "
                f"codec {codec.name!r} is not the one that compressed the rows (a codec of "
                "your own is known by its function's name only; give the storage the "
                "functions the checkpoint was written with).")


def blob_checksums(rows: Sequence[CompressedRow]) -> torch.Tensor:
    """The CRC-32 of each row's compressed bytes, an int64 tensor (a state's ``"blob_crc"``).

    Examples
    --------
    >>> rows = [CompressedRow(RowLayout("tensor", (), ((None, torch.uint8, (2,)),)), b"ab")]
    >>> blob_checksums(rows).tolist() == [zlib.crc32(b"ab")]
    True
    """
    return torch.tensor([zlib.crc32(row.blob) for row in rows], dtype=torch.int64)


def check_blob_checksums(rows: Sequence[CompressedRow], checksums: Any, name: str) -> None:
    """``ValueError`` naming the first row whose compressed bytes do not have the CRC-32
    ``checksums`` records (``None``: a state saved before they were recorded, not checked);
    ``name`` is the entry's, for the message.

    Examples
    --------
    >>> rows = [CompressedRow(RowLayout("tensor", (), ((None, torch.uint8, (2,)),)), b"ab")]
    >>> check_blob_checksums(rows, blob_checksums(rows), "blob_crc")
    >>> check_blob_checksums(rows, torch.tensor([0]), "blob_crc")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: row 0: its compressed bytes are damaged (their CRC-32 is not the one ...
    """
    if checksums is None:
        return
    if not isinstance(checksums, torch.Tensor) or checksums.dtype != torch.int64 \
            or checksums.shape != (len(rows),):
        raise ValueError(f"{name} must be an int64 tensor of one CRC-32 a row ({len(rows)}), "
                         f"got {checksums!r:.200}.")
    found = blob_checksums(rows)
    bad = (found != checksums).nonzero()
    if bad.numel():
        raise ValueError(f"row {int(bad[0])}: its compressed bytes are damaged (their CRC-32 "
                         f"is not the one {name} records).")


def check_round_trip(codec: RowCodec, layout: RowLayout, raw: bytes, blob: bytes, *,
                     lossy_allowed: bool) -> None:
    """``ValueError`` naming ``compression_fn`` / ``decompression_fn`` unless ``blob`` (``raw``
    compressed by a user's codec) decompresses back: to ``raw`` itself, or with
    ``lossy_allowed`` (a TorchRL-style codec, lossy by choice) to as many bytes. Run on the
    first row of each new layout, before anything is written: a codec that loses bytes is
    refused at the write instead of losing the row.

    >>> layout = RowLayout("tensor", (), ((None, torch.uint8, (2,)),))
    >>> class Truncating:
    ...     name = "truncating"
    ...     def decompress_row(self, blob, layout): return blob[:1]
    >>> try:
    ...     check_round_trip(Truncating(), layout, b"ab", b"ab", lossy_allowed=False)
    ... except ValueError as err:
    ...     print(str(err).split(": ")[-1])
    decompression_fn(compression_fn(row)) gave 1 bytes instead of 2; nothing was written.
    """
    try:
        back = codec.decompress_row(blob, layout)
    except Exception as err:  # the user's functions: any failure refuses the write
        raise ValueError(f"decompression_fn cannot decompress what compression_fn made of a "
                         f"row ({type(err).__name__}: {err}); nothing was written.") from err
    if len(back) != len(raw) or not (lossy_allowed or back == raw):
        what = (f"{len(back)} bytes instead of {len(raw)}" if len(back) != len(raw)
                else f"other bytes than the {len(raw)} written")
        raise ValueError(f"compression_fn and decompression_fn do not round-trip: "
                         f"decompression_fn(compression_fn(row)) gave {what}; nothing was "
                         "written.")


def raw_row(codec: RowCodec, row: CompressedRow, layout: RowLayout, nbytes: int, slots: Any,
            position: int, count: int) -> bytes:
    """The ``nbytes`` raw bytes of ``row`` (``layout.nbytes``, looked up once per batch by the
    caller; flat position ``position`` of ``slots``, one of ``count`` rows read), or
    ``ValueError`` naming where it was read from."""
    try:
        raw = codec.decompress_row(row.blob, layout)
    except Exception as err:  # any codec failure: the row's bytes are damaged
        where = (f"slot {int(torch.as_tensor(slots).reshape(-1)[position])}"
                 if slots is not None else f"row {position} of the {count} read")
        if isinstance(err, DecompressionFnError):  # (the user's function, not the bytes)
            raise ValueError(f"the compressed row at {where}: {err}") from err
        raise ValueError(f"the compressed row at {where} cannot be decompressed "
                         f"({type(err).__name__}: {err}): its bytes are damaged.") from err
    if len(raw) != nbytes:
        raise ValueError(f"a compressed row decompressed to {len(raw)} bytes, its layout "
                         f"needs {nbytes}: the codec does not round-trip.")
    return raw
