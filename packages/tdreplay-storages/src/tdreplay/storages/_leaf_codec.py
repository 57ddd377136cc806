"""TorchRL's codec contract for :class:`~tdreplay.storages.CompressedListStorage`: per leaf.

TorchRL calls ``compression_fn(leaf)`` on each tensor of a row as it is (any dtype and
shape) and ``decompression_fn(compressed, metadata)`` with what ``compression_fn`` returned
and the leaf's ``{"type", "shape", "dtype", "device"}``. :class:`LeafCodec` keeps that
contract and still stores a row as one ``bytes`` blob (so the storage's checkpointer is the
same): each leaf's compressed value is framed in the blob with what is needed to hand it back
as it was returned (a tensor with its dtype and shape, or bytes).
"""

from __future__ import annotations

import inspect
import math
import struct
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ._compressed_rows import RowLayout, itemsize
from ._layout import dtype_from_str

__all__ = ["DecompressionFnError", "LeafCodec", "takes_metadata", "tensor_bytes"]

_BYTES, _TENSOR = 0, 1
_HEADER = struct.Struct("<BQ")  # kind, payload bytes
_TENSOR_HEADER = struct.Struct("<BB")  # dtype name length, ndim


def takes_metadata(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` needs two positional arguments (TorchRL's ``decompression_fn(data,
    metadata)``); ``False`` when its signature cannot be read (builtins take bytes).

    Examples
    --------
    >>> takes_metadata(lambda data, metadata: data), takes_metadata(lambda blob: blob)
    (True, False)
    """
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    required = [p for p in params if p.kind in positional and p.default is p.empty]
    return len(required) >= 2


def tensor_bytes(tensor: torch.Tensor) -> bytes:
    """The raw bytes of ``tensor``'s elements in C order, on the host (any dtype, bfloat16
    included; ``b""`` for no elements).

    Examples
    --------
    >>> tensor_bytes(torch.tensor([1, 2], dtype=torch.int16))
    b'\\x01\\x00\\x02\\x00'
    """
    flat = tensor.detach().resolve_conj().contiguous().cpu().reshape(-1)  # (conj: by values)
    return flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""


class DecompressionFnError(ValueError):
    """A user's ``decompression_fn`` returned a tensor of another shape or dtype than the
    entry written: the function is wrong, not the stored bytes."""


def _frame(value: Any) -> bytes:
    """One leaf's compressed value as bytes that :func:`_unframe` turns back into it."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        payload = bytes(value)
        return _HEADER.pack(_BYTES, len(payload)) + payload
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"compression_fn must return a tensor or bytes, got "
                        f"{type(value).__name__}.")
    name = str(value.dtype).removeprefix("torch.").encode()
    dims = struct.pack(f"<{value.ndim}q", *value.shape)
    payload = tensor_bytes(value)
    return (_HEADER.pack(_TENSOR, len(payload)) + _TENSOR_HEADER.pack(len(name), value.ndim)
            + name + dims + payload)


def _unframe(blob: memoryview, offset: int) -> tuple[Any, int]:
    """The value framed at ``offset`` of ``blob`` and the offset after it."""
    kind, size = _HEADER.unpack_from(blob, offset)
    offset += _HEADER.size
    if kind == _BYTES:
        return bytes(blob[offset: offset + size]), offset + size
    name_len, ndim = _TENSOR_HEADER.unpack_from(blob, offset)
    offset += _TENSOR_HEADER.size
    dtype = dtype_from_str(bytes(blob[offset: offset + name_len]).decode())
    offset += name_len
    shape = struct.unpack_from(f"<{ndim}q", blob, offset)
    offset += 8 * ndim
    if size:
        value = torch.frombuffer(bytearray(blob[offset: offset + size]), dtype=dtype)
    else:
        value = torch.empty(0, dtype=dtype)
    return value.reshape(shape), offset + size


class LeafCodec:
    """A codec of TorchRL's contract: ``compression_fn(leaf)`` per tensor of a row,
    ``decompression_fn(compressed, metadata)`` to rebuild it.

    ``compression_fn`` gets each leaf as it is written (on the CPU) and returns a tensor (any
    dtype and shape) or bytes; ``decompression_fn`` gets that value back and ``metadata``:
    ``{"type": "tensor", "shape": torch.Size, "dtype": torch.dtype, "device": cpu}``, and
    returns a tensor of that shape and dtype (``ValueError`` otherwise: a row is never rebuilt
    from leaves of other shapes). Lossy functions are the user's choice.

    Parameters
    ----------
    name : str
        Recorded in checkpoints, as :class:`~tdreplay.storages.compressed_storage.Codec`'s.
    compression_fn, decompression_fn : callable
        As above.

    Examples
    --------
    >>> codec = LeafCodec("half", lambda t: t.to(torch.float16),
    ...                   lambda c, metadata: c.to(metadata["dtype"]))
    >>> from tdreplay.storages._compressed_rows import RowLayout
    >>> layout = RowLayout("tensor", (), ((None, torch.float32, (2,)),))
    >>> blob = codec.compress_row([torch.tensor([1.5, 2.0])])
    >>> raw = codec.decompress_row(blob, layout)
    >>> torch.frombuffer(bytearray(raw), dtype=torch.float32).tolist()
    [1.5, 2.0]
    """


    def __init__(self, name: str, compression_fn: Callable[[torch.Tensor], Any],
                 decompression_fn: Callable[[Any, dict[str, Any]], Any]) -> None:
        self.name = name
        self.compression_fn = compression_fn
        self.decompression_fn = decompression_fn

    def compress_row(self, leaves: Sequence[torch.Tensor]) -> bytes:
        """The blob of a row whose leaves (in layout order) are ``leaves``."""
        return b"".join(_frame(self.compression_fn(leaf.detach().cpu())) for leaf in leaves)

    def decompress_row(self, blob: bytes, layout: RowLayout) -> bytes:
        """The raw bytes (leaves back to back, in layout order) of the row ``blob`` holds."""
        view = memoryview(blob)
        offset = 0
        parts = []
        for key, dtype, shape in layout.leaves:
            value, offset = _unframe(view, offset)
            meta = {"type": "tensor", "shape": torch.Size(shape), "dtype": dtype,
                    "device": torch.device("cpu")}
            out = self.decompression_fn(value, meta)
            if (not isinstance(out, torch.Tensor) or out.dtype != dtype
                    or tuple(out.shape) != tuple(shape)):
                got = (f"{out.dtype} {tuple(out.shape)}" if isinstance(out, torch.Tensor)
                       else type(out).__name__)
                raise DecompressionFnError(
                    f"decompression_fn returned {got} for entry {key!r}, which was written as "
                    f"{dtype} {tuple(shape)}: it must return the tensor of metadata['shape'] "
                    "and metadata['dtype'].")
            raw = tensor_bytes(out)
            assert len(raw) == math.prod(shape) * itemsize(dtype)
            parts.append(raw)
        if offset != len(view):
            raise ValueError("a compressed row holds more leaves than its layout.")
        return b"".join(parts)

    def __repr__(self) -> str:
        return f"LeafCodec({self.name!r})"
