"""``CompressedListStorage``: a list storage whose rows are kept compressed.

Each row (a tensor or a TensorDict) is stored as one compressed blob of the raw bytes of its
leaves, next to a *layout* (keys, dtypes, shapes, batch size) shared by every row of the same
structure. ``get`` decompresses only the rows asked for.

The default codec is zstd (the ``zstandard`` package, the ``zstd`` extra of this package) when
it is installed, else ``zlib`` from the standard library.
"""

from __future__ import annotations

import builtins
import math
import pickle
import warnings
import zlib
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np
import torch
from tensordict import (
    NonTensorData,
    NonTensorStack,
    TensorDict,
    TensorDictBase,
    is_tensor_collection,
    is_tensorclass,
)

from tdreplay.core import ListStorage, StorageCheckpointerBase
from tdreplay.core.storage import written_slots
from tdreplay.core.utils import as_long_tensor, check_flag, is_int

from ._codec_check import (
    blob_checksums,
    check_blob_checksums,
    check_round_trip,
    check_row_checksums,
    raw_row,
    row_checksums,
)
from ._compressed_rows import CompressedRow, RowLayout, itemsize, layout_problem
from ._keys import warn_empty_levels
from ._leaf_codec import LeafCodec, takes_metadata, tensor_bytes
from ._row_records import rows_from_record, rows_record
from ._source_checks import check_dense
from ._tensorclasses import inner_first, nested_tensorclasses, with_classes
from .checkpointers import CompressedListStorageCheckpointer

__all__ = ["Codec", "CompressedListStorage", "CompressedRow", "LeafCodec", "RowLayout",
           "builtin_codec", "default_codec"]

try:
    import zstandard as _zstd  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # pragma: no cover - depends on the environment
    _zstd = None

_ZSTD_LEVELS = range(-131072, 23)


class Codec:
    """A named pair of byte-level ``compress`` / ``decompress`` functions.

    Parameters
    ----------
    name : str
        Recorded in checkpoints; a checkpoint is only loaded by a storage with the same codec.
    compress, decompress : callable
        ``bytes -> bytes``.
    remake : tuple, optional
        ``(function, args)`` that builds this codec again: what pickling records instead of
        ``compress`` / ``decompress`` (bound methods of a zstd compressor, or a lambda, do not
        pickle). :func:`default_codec` sets it; otherwise the two functions are pickled.

    Examples
    --------
    >>> import pickle
    >>> codec = default_codec(5)
    >>> copy = pickle.loads(pickle.dumps(codec))  # a storage holding it pickles with it
    >>> copy.name == codec.name, copy.decompress(codec.compress(b"ab" * 50)) == b"ab" * 50
    (True, True)
    """

    def __init__(self, name: str, compress: Callable[[bytes], bytes],
                 decompress: Callable[[bytes], bytes], *,
                 remake: tuple[Callable[..., Codec], tuple[Any, ...]] | None = None) -> None:
        self.name = name
        self.compress = compress
        self.decompress = decompress
        self.remake = remake

    def __reduce__(self) -> tuple[Any, ...]:
        if self.remake is not None:
            return self.remake
        return (Codec, (self.name, self.compress, self.decompress))

    def compress_row(self, leaves: Sequence[torch.Tensor]) -> bytes:
        """The blob of a row whose leaves (in layout order) are ``leaves``: their raw bytes
        back to back, compressed."""
        return self.compress(b"".join(tensor_bytes(t) for t in leaves))

    def decompress_row(self, blob: bytes, layout: RowLayout) -> bytes:
        """The raw bytes of the row ``blob`` holds (``layout`` unused: one run of bytes)."""
        return self.decompress(blob)

    def __repr__(self) -> str:
        return f"Codec({self.name!r})"


def _compressed_tensor(codec: Codec, tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s element bytes compressed by ``codec``, as a uint8 tensor."""
    return torch.frombuffer(bytearray(codec.compress(tensor_bytes(tensor))), dtype=torch.uint8)


def _decompressed_tensor(codec: Codec, compressed: Any, metadata: Mapping[str, Any]
                         ) -> torch.Tensor:
    """The tensor of ``metadata``'s ``shape`` and ``dtype`` whose element bytes ``codec``
    compressed into ``compressed`` (a uint8 tensor or bytes)."""
    blob = compressed if isinstance(compressed, (bytes, bytearray)) \
        else compressed.cpu().numpy().tobytes()
    raw = bytearray(codec.decompress(bytes(blob)))
    dtype = metadata["dtype"]
    if not raw:
        return torch.empty(metadata["shape"], dtype=dtype)
    return torch.frombuffer(raw, dtype=dtype).reshape(metadata["shape"])


def default_codec(compression_level: int = 3) -> Codec:
    """zstd at ``compression_level`` when ``zstandard`` is installed, else zlib.

    zlib levels go from -1 to 9: a higher zstd-style level is capped at 9.

    Every compressed row carries a checksum of its bytes, so a damaged row raises when it is
    decompressed instead of reading as other values: zlib streams end with one (Adler-32), and
    zstd frames get one (4 bytes a row). Without it, 64 of the 83 single-byte changes of a
    zstd frame of 256 bytes decompressed silently to other bytes.

    Examples
    --------
    >>> codec = default_codec(3)
    >>> codec.name in ("zstd", "zlib")
    True
    >>> codec.decompress(codec.compress(b"abc" * 100)) == b"abc" * 100
    True
    """
    return builtin_codec("zstd" if _zstd is not None else "zlib", compression_level)


def builtin_codec(name: str, compression_level: int = 3) -> Codec:
    """The built-in codec ``name`` (``"zstd"``, which needs the ``zstandard`` package, or
    ``"zlib"``) at ``compression_level``: what :func:`default_codec` picks from, and what a
    storage on the default codec reads a checkpoint of the other one with.

    Examples
    --------
    >>> codec = builtin_codec("zlib", 6)
    >>> codec.name, codec.decompress(codec.compress(b"xy" * 64)) == b"xy" * 64
    ('zlib', True)
    >>> builtin_codec("lz4")
    Traceback (most recent call last):
    ...
    ValueError: no built-in codec 'lz4': the built-in codecs are 'zstd' and 'zlib'.
    """
    if name not in ("zstd", "zlib"):
        raise ValueError(f"no built-in codec {name!r}: the built-in codecs are 'zstd' and "
                         "'zlib'.")
    if isinstance(compression_level, bool) or not is_int(compression_level):
        raise TypeError(f"compression_level must be an int, got {compression_level!r}.")
    level = int(compression_level)
    if name == "zstd":
        if _zstd is None:
            raise ValueError("the zstd codec needs the zstandard package "
                             "(pip install 'tdreplay-storages[zstd]').")
        if level not in _ZSTD_LEVELS:
            raise ValueError(f"compression_level must lie in [-131072, 22] for zstd, got {level}.")
        compressor = _zstd.ZstdCompressor(level=level, write_checksum=True)
        decompressor = _zstd.ZstdDecompressor()
        return Codec("zstd", compressor.compress, decompressor.decompress,
                     remake=(builtin_codec, ("zstd", level)))
    if level < -1:
        raise ValueError(f"compression_level must be >= -1 for zlib, got {level}.")
    capped = min(level, 9)
    return Codec("zlib", lambda raw: zlib.compress(raw, capped), zlib.decompress,
                 remake=(builtin_codec, ("zlib", level)))


def _user_codec(compression_fn: Callable[[torch.Tensor], Any],
                decompression_fn: Callable[[torch.Tensor], Any]) -> Codec:
    """Wrap tensor-level user functions (uint8 tensor in, uint8 tensor or bytes out)."""

    def to_bytes(out: Any, name: str) -> bytes:
        if isinstance(out, (bytes, bytearray, memoryview)):
            return bytes(out)
        if isinstance(out, torch.Tensor) and out.dtype is torch.uint8:
            return out.contiguous().cpu().numpy().tobytes()
        raise TypeError(f"{name} must return bytes or a uint8 tensor, got {type(out).__name__}.")

    def compress(raw: bytes) -> bytes:
        return to_bytes(compression_fn(torch.frombuffer(bytearray(raw), dtype=torch.uint8)),
                        "compression_fn")

    def decompress(blob: bytes) -> bytes:
        return to_bytes(decompression_fn(torch.frombuffer(bytearray(blob), dtype=torch.uint8)),
                        "decompression_fn")

    name = f"custom:{getattr(compression_fn, '__qualname__', type(compression_fn).__name__)}"
    # (pickled as the user's two functions: the wrappers above are local)
    return Codec(name, compress, decompress,
                 remake=(_user_codec, (compression_fn, decompression_fn)))


def _mapping_entries(item: Mapping[Any, Any], prefix: tuple[str, ...]
                     ) -> list[tuple[tuple[str, ...], Any]]:
    """``[(nested key, value)]`` of the leaves of a dict row (nested dicts are levels)."""
    if not item and prefix:
        raise TypeError(f"entry {prefix!r} is an empty dict, which a compressed row cannot "
                        "keep.")
    entries = []
    for name, value in item.items():
        if not isinstance(name, str):
            raise TypeError(f"dict rows have str keys, got {name!r} in entry {prefix!r}.")
        if isinstance(value, Mapping) and not isinstance(value, TensorDictBase):
            entries.extend(_mapping_entries(value, (*prefix, name)))
        else:
            entries.append(((*prefix, name), value))
    return entries


def _saved_rows(saved: Any) -> list[CompressedRow]:
    """The rows of a ``state_dict``'s ``"storage"``: a record of :func:`rows_record`, or
    (states saved by 0.6) a list of :class:`CompressedRow`; ``ValueError`` otherwise."""
    if isinstance(saved, list) and all(isinstance(row, CompressedRow) for row in saved):
        return saved
    if isinstance(saved, dict):
        try:
            return rows_from_record(saved)
        except ValueError as err:
            raise ValueError(f"state_dict['storage']: {err}") from err
    raise ValueError("CompressedListStorage state_dict needs a 'storage' record of its rows "
                     f"(or a list of CompressedRow), got {type(saved).__name__}.")


def _row_layout(item: Any, lead: int) -> tuple[RowLayout, list[torch.Tensor]]:
    """Layout of the rows of ``item`` and its leaves in blob order.

    ``lead`` leading dimensions of ``item`` are the batch (0 for one row, 1 for a batch).
    """
    if isinstance(item, torch.Tensor):
        check_dense("data", item)
        return RowLayout("tensor", (), ((None, item.dtype, tuple(item.shape[lead:])),)), [item]
    root, nested = None, item
    if is_tensorclass(item) and not isinstance(item, (NonTensorData, NonTensorStack)):
        root, item = type(item), item.to_tensordict()  # (read back as its class)
    if isinstance(item, TensorDictBase):
        kind, batch_size = "tensordict", tuple(item.batch_size[lead:])
        for key, value in item.non_tensor_items(include_nested=True):
            # (leaves_only keys skip them: they would be dropped without a word)
            raise TypeError(f"entry {key!r} is a {type(value).__name__}: "
                            "CompressedListStorage compresses tensors only.")
        entries = [(key, item.get(key))
                   for key in item.keys(include_nested=True, leaves_only=True)]
    elif isinstance(item, Mapping) and lead == 0:
        kind, batch_size, entries = "dict", (), _mapping_entries(item, ())
    else:
        raise TypeError(f"CompressedListStorage stores tensors, TensorDicts, tensorclasses "
                        f"and dicts of tensors, got {type(item).__name__}.")
    for key, value in entries:
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"entry {key!r} is a {type(value).__name__}: "
                            "CompressedListStorage compresses tensors only.")
        check_dense(f"entry {key!r}", value)
    # widest dtypes first: every leaf then starts at a multiple of its item size
    entries.sort(key=lambda kv: (-kv[1].element_size(), str(kv[0])))
    leaves = tuple((key, value.dtype, tuple(value.shape[lead:])) for key, value in entries)
    # tensorclasses nested in a TensorDict row (only rows with nested keys may hold some)
    classes = (inner_first(nested_tensorclasses(nested))
               if kind == "tensordict" and any(type(key) is tuple for key, _ in entries)
               else ())
    return (RowLayout(kind, batch_size, leaves, classes, root),
            [value for _, value in entries])


class CompressedListStorage(ListStorage):
    """A list storage that keeps every row compressed and decompresses only sampled rows.

    Useful for large, redundant rows such as image observations. Rows are tensors,
    TensorDicts or dicts of tensors (nested keys, any dtype); each is compressed as one blob
    when written, and read back as what was written (a dict row as a dict).

    Parameters
    ----------
    max_size : int
        Capacity in rows.
    compression_fn : callable, optional
        Takes a 1-D ``uint8`` tensor (the raw bytes of a row) and returns the compressed bytes
        (``bytes`` or a ``uint8`` tensor). Defaults to zstd (zlib without ``zstandard``).
        With a ``decompression_fn`` of two arguments (TorchRL's contract), it is called on
        each tensor of a row as it is instead, and may return a tensor of any dtype and shape
        or bytes (see :class:`LeafCodec`).
    decompression_fn : callable, optional
        The inverse of ``compression_fn`` (required when it is given): ``blob -> bytes`` (one
        argument), or TorchRL's ``(compressed, metadata) -> tensor``, where ``metadata`` holds
        the leaf's ``"shape"``, ``"dtype"``, ``"device"`` and ``"type"``. The pair is checked
        on the first row of each new row structure only (decompressed at the write: the same
        bytes back for a one-argument codec, as many for a two-argument one, else the write is
        refused); a codec whose losses depend on the values can still pass that check.
    compression_level : int
        Level of the default codec (1-22 for zstd, capped at 9 for zlib). Defaults to 3.
    device : str or torch.device
        Where decompressed rows are sent. Defaults to ``"cpu"``.
    checkpointer : StorageCheckpointerBase, optional
        Defaults to :class:`CompressedListStorageCheckpointer`.
    compilable : bool
        Accepted as in TorchRL; no effect (see :class:`~tdreplay.core.Storage`).

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> s = CompressedListStorage(100)
    >>> frames = torch.zeros(8, 84, 84, dtype=torch.uint8)
    >>> s.set(torch.arange(8), TensorDict({"pixels": frames, "reward": torch.ones(8)}, [8]))
    >>> batch = s.get(torch.tensor([3, 5]))
    >>> batch["pixels"].shape, batch["pixels"].dtype
    (torch.Size([2, 84, 84]), torch.uint8)
    >>> s.raw_nbytes > 100 * s.nbytes  # zeros compress very well
    True
    """

    # core's ListStorage leaves its _default_checkpointer unannotated (inferred as
    # type[ListStorageCheckpointer]); Storage declares type[StorageCheckpointerBase]
    _default_checkpointer = CompressedListStorageCheckpointer  # type: ignore[assignment]
    keeps_written_objects = False  # (it keeps compressed bytes of what it is given)

    state_entries = ("storage", "codec", "max_size", "row_crc", "blob_crc")

    def __init__(
        self,
        max_size: int,
        *,
        compression_fn: Callable[[torch.Tensor], Any] | None = None,
        decompression_fn: Callable[..., Any] | None = None,
        compression_level: int = 3,
        device: str | torch.device = "cpu",
        checkpointer: StorageCheckpointerBase | None = None,
        compilable: bool = False,
    ) -> None:
        if (compression_fn is None) != (decompression_fn is None):
            raise ValueError("compression_fn and decompression_fn must be given together.")
        for name, fn in (("compression_fn", compression_fn),
                         ("decompression_fn", decompression_fn)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{name} must be callable, got {type(fn).__name__}.")
        super().__init__(max_size, checkpointer, compilable=compilable)
        self.compression_level = compression_level
        self.codec: Codec | LeafCodec
        if compression_fn is None or decompression_fn is None:
            self.codec = default_codec(compression_level)
        elif takes_metadata(decompression_fn):  # TorchRL's contract: leaf by leaf
            name = getattr(compression_fn, "__qualname__", type(compression_fn).__name__)
            self.codec = LeafCodec(f"custom-leaf:{name}", compression_fn, decompression_fn)
        else:
            self.codec = _user_codec(compression_fn, decompression_fn)
        self._device = torch.device(device)
        self._layouts: dict[RowLayout, RowLayout] = {}
        self._given_fns = (compression_fn, decompression_fn)

    @property
    def compression_fn(self) -> Callable[[torch.Tensor], Any]:
        """The function compressing a tensor (TorchRL's attribute): the one given, else the
        default codec's, ``tensor -> uint8 tensor`` of the compressed bytes of its elements.

        Examples
        --------
        >>> s = CompressedListStorage(10)
        >>> x = torch.arange(6.).reshape(2, 3)
        >>> c = s.compression_fn(x)
        >>> c.dtype, s.decompression_fn(c, {"shape": x.shape, "dtype": x.dtype}).equal(x)
        (torch.uint8, True)
        """
        given = self._given_fns[0]
        if given is not None:
            return given
        assert isinstance(self.codec, Codec)  # (no functions given: the default codec)
        return partial(_compressed_tensor, self.codec)

    @property
    def decompression_fn(self) -> Callable[..., Any]:
        """The inverse of :attr:`compression_fn` (TorchRL's attribute): the one given, else
        the default codec's, ``(compressed, metadata) -> tensor`` of ``metadata["shape"]`` and
        ``metadata["dtype"]``."""
        given = self._given_fns[1]
        if given is not None:
            return given
        assert isinstance(self.codec, Codec)  # (no functions given: the default codec)
        return partial(_decompressed_tensor, self.codec)

    @property
    def device(self) -> torch.device:
        return self._device

    # ---- compression -------------------------------------------------------------------------
    def _intern(self, layout: RowLayout, data: Any = None,
                first: tuple[bytes, bytes] | None = None) -> RowLayout:
        """The one object of ``layout`` the rows of this structure share; a structure seen
        first warns of the empty nested TensorDicts of ``data`` (a row keeps tensors), and,
        with a user's codec, is refused unless ``first`` (``(raw bytes, blob)`` of its first
        row) decompresses back (see :func:`._codec_check.check_round_trip`)."""
        known = self._layouts.get(layout)
        if known is not None:
            return known
        if first is not None and self._given_fns[0] is not None:
            check_round_trip(self.codec, layout, *first,
                             lossy_allowed=isinstance(self.codec, LeafCodec))
        if isinstance(data, TensorDictBase):
            warn_empty_levels(data, type(self).__name__)
        return self._layouts.setdefault(layout, layout)

    def _compress(self, item: Any) -> CompressedRow:
        layout, tensors = _row_layout(item, 0)
        blob = self.codec.compress_row(tensors)
        known = self._layouts.get(layout)
        if known is not None:
            return CompressedRow(known, blob)
        first = None
        if self._given_fns[0] is not None:  # (a user's codec: checked on its first row)
            first = (b"".join(tensor_bytes(t) for t in tensors), blob)
        return CompressedRow(self._intern(layout, item, first), blob)

    def _compress_rows(self, data: Any) -> list[CompressedRow]:
        """Compress each row of ``data`` (batched along dim 0).

        The rows of a tensor or a dense TensorDict share one layout: it is worked out once and
        the raw bytes of every row come from one copy of the batch, instead of unbinding the
        batch and walking each row's keys.
        """
        dense = (type(data) is TensorDict and data.batch_dims > 0
                 or isinstance(data, torch.Tensor) and data.ndim > 0)
        codec = self.codec
        if dense and isinstance(codec, Codec):
            try:
                layout, tensors = _row_layout(data, 1)
            except TypeError:  # a non-tensor entry: the per-row path raises naming it
                dense = False
        if not dense or not isinstance(codec, Codec):  # a LeafCodec compresses leaf by leaf
            return [self._compress(item) for item in data.unbind(0)]
        n = len(data)
        parts = [t.detach().cpu().resolve_conj().contiguous().reshape(n, math.prod(t.shape[1:]))
                 .view(torch.uint8) for t in tensors if math.prod(t.shape[1:])]
        raw = (torch.cat(parts, 1) if parts else torch.empty((n, 0), dtype=torch.uint8)).numpy()
        compress = codec.compress
        blobs = [compress(raw[i].tobytes()) for i in range(n)]
        first = (raw[0].tobytes(), blobs[0]) if n and self._given_fns[0] is not None else None
        layout = self._intern(layout, data, first)
        return [CompressedRow(layout, blob) for blob in blobs]

    def _decompress_batch(self, rows: Sequence[CompressedRow], shape: tuple[int, ...],
                          slots: Any = None, first: int = 0) -> Any:
        """Rebuild rows sharing one layout as a batch of batch shape ``[*shape, *batch_size]``.

        ``slots`` (where the rows were read from, row ``i`` at flat position ``first + i``;
        optional) names a row whose bytes do not decompress in the ``ValueError`` raised for it
        (a state_dict changed after it was saved, say: loading checks one row per layout, not
        every row)."""
        layout = rows[0].layout
        nbytes = layout.nbytes  # one lookup for the batch (it hashes the whole layout)
        tensors = []
        offset = 0
        if len(rows) == 1:
            # each leaf copied out of the row's bytes into memory of its own: views of one
            # buffer as several dtypes could not be saved (torch.save, pickle) nor resized
            raw = np.frombuffer(raw_row(self.codec, rows[0], layout, nbytes, slots, first, 1),
                                dtype=np.uint8)
            for _, dtype, leaf_shape in layout.leaves:
                size = math.prod(leaf_shape) * itemsize(dtype)
                tensor = torch.empty(size, dtype=torch.uint8)
                tensor.numpy()[:] = raw[offset: offset + size]
                tensors.append(tensor.view(dtype).reshape((*shape, *leaf_shape))
                               .to(self._device))
                offset += size
        else:
            buffer = torch.empty((len(rows), nbytes), dtype=torch.uint8)
            flat = buffer.numpy().reshape(-1).data  # a memoryview of the buffer's bytes
            for i, row in enumerate(rows):
                flat[i * nbytes: (i + 1) * nbytes] = raw_row(
                    self.codec, row, layout, nbytes, slots, first + i, len(rows))
            for _, dtype, leaf_shape in layout.leaves:
                size = math.prod(leaf_shape) * itemsize(dtype)
                if size == 0:
                    tensor = torch.empty((*shape, *leaf_shape), dtype=dtype)
                else:
                    tensor = buffer[:, offset: offset + size].contiguous().view(dtype)
                tensors.append(tensor.reshape((*shape, *leaf_shape)).to(self._device))
                offset += size
        if layout.kind == "tensor":
            return tensors[0]
        source = {}
        for (key, _, _), tensor in zip(layout.leaves, tensors):
            source[key] = tensor
        out = TensorDict(source, batch_size=(*shape, *layout.batch_size), device=self._device)
        if layout.classes:  # tensorclasses nested in the rows: read back as they were written
            out = with_classes(out, layout.classes)
        root: Any = layout.root  # (a tensorclass: its from_tensordict)
        if root is not None:  # rows written as a tensorclass
            return root.from_tensordict(out)
        return out.to_dict() if layout.kind == "dict" else out  # (nested keys: nested dicts)

    def _decompress(self, row: CompressedRow, slots: Any = None, position: int = 0) -> Any:
        return self._decompress_batch([row], (), slots, position)

    def _decompress_rows(self, rows: list[CompressedRow], shape: tuple[int, ...],
                         slots: Any = None) -> Any:
        """A batch when every row has one layout, else a list of rows (``slots``: see
        :meth:`_decompress_batch`)."""
        if rows and all(row.layout is rows[0].layout for row in rows):
            return self._decompress_batch(rows, shape, slots)
        return [self._decompress(row, slots, i) for i, row in enumerate(rows)]

    # ---- storage contract ------------------------------------------------------------------------
    def set(self, cursor: int | slice | torch.Tensor | Sequence[int], data: Any, *,
            set_cursor: bool = True) -> None:
        if set_cursor is not True and set_cursor is not False:  # (one check when a bool)
            check_flag(set_cursor, "set_cursor")
        if is_int(cursor):
            compressed: Any = self._compress(data)
        else:
            if isinstance(data, torch.Tensor) or is_tensor_collection(data):
                compressed = self._compress_rows(data)
            elif isinstance(data, list):
                compressed = [self._compress(item) for item in data]
            else:
                raise TypeError("CompressedListStorage.set with several rows expects a list, a "
                                f"tensor or a TensorDict batched along dim 0, got "
                                f"{type(data).__name__}.")
        super().set(cursor, compressed, set_cursor=set_cursor)

    def get(self, index: int | slice | torch.Tensor) -> Any:
        """Decompress the rows at ``index``: one batch of shape ``index.shape`` when they share
        a structure, else a list of rows (stacked lazily by :meth:`default_collate`)."""
        if isinstance(index, torch.Tensor) and index.dtype is torch.bool:
            rows = super().get(index)  # (a mask, checked: the written rows it marks)
            return self._decompress_rows(rows, (len(rows),), index.nonzero().reshape(-1))
        if isinstance(index, torch.Tensor) and index.ndim > 1:
            rows = super().get(index.reshape(-1))  # (flat: the batch takes the index's shape)
        else:
            rows = super().get(index)
        if isinstance(rows, CompressedRow):
            return self._decompress(rows, index)
        shape = tuple(index.shape) if isinstance(index, torch.Tensor) else (len(rows),)
        return self._decompress_rows(rows, shape, index)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            rows = self._storage[index]
            slots = range(len(self._storage))[index]
            return self._decompress_rows(rows, (len(rows),), slots) if rows else []
        if isinstance(index, torch.Tensor) and index.dtype is torch.bool:
            index = written_slots(index, len(self._storage))  # (one entry per written row)
        elif not is_int(index):
            index = as_long_tensor(index, name="index")
        return super().__getitem__(index)  # negative ints count from the last written row

    # ---- accounting ------------------------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        """Compressed bytes held (the blobs)."""
        return sum(len(row.blob) for row in self._storage)

    @property
    def raw_nbytes(self) -> int:
        """Bytes the written rows take uncompressed."""
        return sum(row.layout.nbytes for row in self._storage)

    def bytes(self) -> int:
        """The number of bytes the storage holds compressed (TorchRL's ``bytes()``): the sum of
        the compressed blobs of the written rows, as :attr:`nbytes`. An empty storage returns 0
        with a warning, as TorchRL's.

        Examples
        --------
        >>> s = CompressedListStorage(10)
        >>> s.set(torch.arange(2), torch.zeros(2, 1000))
        >>> s.bytes() == s.nbytes == sum(len(row.blob) for row in s.items())
        True
        >>> s.bytes() < s.raw_nbytes
        True
        """
        if not self._storage:
            warnings.warn("Compressed storage is empty, returning 0 bytes.", UserWarning,
                          stacklevel=2)
            return 0
        return self.nbytes

    def to_bytestream(self, data_to_bytestream: torch.Tensor | np.ndarray | Any
                      ) -> builtins.bytes:
        """``data_to_bytestream`` as bytes (TorchRL's ``to_bytestream``): a tensor's raw element
        bytes in C order (what the default codec compresses), a numpy array's
        (``ndarray.tobytes()``), anything else pickled (``pickle.dumps``).

        TorchRL's raises ``TypeError`` for anything but a tensor (it tests ``isinstance(x,
        np.array)``, a function); this one converts numpy arrays and other objects as it
        intends. Any dtype converts, ``bfloat16`` and tensors that require grad included.

        Examples
        --------
        >>> s = CompressedListStorage(4)
        >>> s.to_bytestream(torch.tensor([1, 2], dtype=torch.int16))
        b'\\x01\\x00\\x02\\x00'
        >>> s.to_bytestream(np.array([1, 2], dtype=np.int16))
        b'\\x01\\x00\\x02\\x00'
        >>> import pickle
        >>> pickle.loads(s.to_bytestream({"a": 1}))
        {'a': 1}
        """
        if isinstance(data_to_bytestream, torch.Tensor):
            return tensor_bytes(data_to_bytestream)
        if isinstance(data_to_bytestream, np.ndarray):
            return data_to_bytestream.tobytes()
        return pickle.dumps(data_to_bytestream)

    # ---- state -----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The compressed rows (not decompressed, as tensors and plain values: ``torch.load``
        reads them with ``weights_only=True``), the codec name, ``max_size``, the CRC-32 of
        the first row of each layout decompressed (``"row_crc"``: a storage with another codec
        of the same name refuses the rows, see :func:`row_checksums`) and of every row's
        compressed bytes (``"blob_crc"``: a state with damaged bytes is refused whole).

        Examples
        --------
        >>> import io
        >>> s = CompressedListStorage(4)
        >>> s.set(torch.arange(2), torch.arange(6).reshape(2, 3))
        >>> buffer = io.BytesIO()
        >>> torch.save(s.state_dict(), buffer)
        >>> _ = buffer.seek(0)
        >>> t = CompressedListStorage(4)
        >>> t.load_state_dict(torch.load(buffer, weights_only=True))
        >>> t.get(torch.tensor([1, 0])).tolist()
        [[3, 4, 5], [0, 1, 2]]
        """
        rows = list(self._storage)
        return {"storage": rows_record(rows), "codec": self.codec.name,
                "max_size": self.max_size, "row_crc": row_checksums(rows, self.codec),
                "blob_crc": blob_checksums(rows)}

    def check_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Refuse a ``state_dict`` of another codec or capacity, with more rows than fit, or
        with a row that cannot be read (a damaged layout, a layout whose first row does not
        decompress to its size) (``ValueError``); changes nothing. One without
        ``"max_size"`` (saved before it was recorded) is checked for its number of rows only.

        Examples
        --------
        >>> big = CompressedListStorage(8)
        >>> CompressedListStorage(4).check_state_dict(big.state_dict())  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: state_dict['max_size'] is 8 but this CompressedListStorage has max_size=4: ...
        """
        self._checked_state(state_dict)

    def _checked_state(self, state_dict: Any) -> tuple[list[CompressedRow], Codec | LeafCodec]:
        """The rows of ``state_dict`` (its record decoded once) and the codec that reads them,
        after every check of :meth:`check_state_dict`."""
        if not isinstance(state_dict, dict):
            raise ValueError(f"CompressedListStorage state_dict must be a dict, got "
                             f"{type(state_dict).__name__}.")
        rows = _saved_rows(state_dict.get("storage"))
        try:
            codec = self.codec_for(state_dict.get("codec"))
        except ValueError as err:
            raise ValueError(f"state_dict: {err}") from err
        super().check_state_dict({**state_dict, "storage": rows})  # max_size, number of rows
        try:
            check_blob_checksums(rows, state_dict.get("blob_crc"), "state_dict['blob_crc']")
        except ValueError as err:
            raise ValueError(f"state_dict['storage']: {err}") from err
        self._check_rows(rows, codec)
        try:
            check_row_checksums(rows, codec, state_dict.get("row_crc"), "state_dict['row_crc']")
        except ValueError as err:
            raise ValueError(f"state_dict: {err}") from err
        return rows, codec

    def saved_rows(self, state_dict: dict[str, Any]) -> int:
        saved = state_dict["storage"]
        return len(saved) if isinstance(saved, list) else saved["row_layouts"].numel()

    def codec_for(self, saved: Any) -> Codec | LeafCodec:
        """The codec that reads rows saved compressed with the codec named ``saved``: this
        storage's own, or, on the default codec, the other built-in one (a zlib checkpoint
        loads where ``zstandard`` is installed now, a zstd one where it is); the storage then
        goes on with the codec of the rows it loaded. ``ValueError`` naming both otherwise.

        Examples
        --------
        >>> storage = CompressedListStorage(4)
        >>> storage.codec_for("zlib").name
        'zlib'
        >>> storage.codec_for("custom:mine")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: rows are compressed with 'custom:mine'; this storage uses ...
        """
        if saved == self.codec.name:
            return self.codec
        if self._given_fns[0] is None and saved in ("zstd", "zlib"):
            return builtin_codec(saved, self.compression_level)
        raise ValueError(f"rows are compressed with {saved!r}; this storage uses "
                         f"{self.codec.name!r}.")

    def _check_rows(self, rows: list[CompressedRow], codec: Codec | LeafCodec) -> None:
        """``ValueError`` naming the row unless every row has bytes and a usable layout, and the
        first row of each layout decompresses to its size (one row per layout: the rows of a
        write share theirs; the bytes of the others are not decompressed here)."""
        seen: set[int] = set()
        for i, row in enumerate(rows):
            problem = None
            if not isinstance(row.blob, (bytes, bytearray, memoryview)):
                problem = f"its blob is a {type(row.blob).__name__}, not bytes"
            elif id(row.layout) in seen:
                continue
            seen.add(id(row.layout))
            if problem is None:
                problem = layout_problem(row.layout)
            if problem is None:
                try:
                    size = len(codec.decompress_row(row.blob, row.layout))
                except Exception as err:  # any codec failure: the row cannot be read
                    problem = f"it does not decompress ({type(err).__name__}: {err})"
                else:
                    if size != row.layout.nbytes:
                        problem = (f"it decompresses to {size} bytes, its layout needs "
                                   f"{row.layout.nbytes}")
            if problem is not None:
                raise ValueError(f"state_dict['storage'][{i}] cannot be read: {problem}.")

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        rows, codec = self._checked_state(state_dict)
        self.replace_items(rows)
        self.codec = codec  # (the other built-in codec, for a checkpoint of it)

    def replace_items(self, items: Sequence[Any]) -> None:
        """Make ``items`` (:class:`CompressedRow` values, as :meth:`items` returns them) the
        written rows; what checkpointers install.

        Rows of equal layouts share one layout object again (a batch decompresses at once).
        ``TypeError`` for an item that is not a ``CompressedRow``, ``ValueError`` when they do
        not fit in ``max_size``.

        Examples
        --------
        >>> s = CompressedListStorage(4)
        >>> s.set(torch.arange(2), torch.arange(6).reshape(2, 3))
        >>> t = CompressedListStorage(4)
        >>> t.replace_items(s.items())
        >>> t.get(torch.tensor([1, 0])).tolist()
        [[3, 4, 5], [0, 1, 2]]
        """
        if not all(isinstance(row, CompressedRow) for row in items):
            raise TypeError("CompressedListStorage rows must be CompressedRow values.")
        if len(items) > self.max_size:
            raise ValueError(f"items holds {len(items)} items; max_size is {self.max_size}.")
        self._storage = [CompressedRow(self._intern(r.layout), r.blob) for r in items]

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(max_size={self.max_size}, len={len(self)}, "
                f"codec={self.codec.name}, nbytes={self.nbytes})")

