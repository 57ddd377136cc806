"""Storage checkpointers: how a storage's contents are laid out in a checkpoint directory.

===================================== =============================================================
checkpointer                          layout
===================================== =============================================================
``TensorStorageCheckpointer``         the written rows as TensorDict memory-mapped files (default of
                                      tensor and memmap storages)
``FlatStorageCheckpointer``           one level of raw files, one per leaf (``next.obs.bin``), with
                                      TED compaction (below)
``NestedStorageCheckpointer``         a TensorDict memmap directory tree mirroring the keys
                                      (``next/obs.memmap``), with TED compaction
``H5StorageCheckpointer``             one HDF5 file (groups mirror the keys), with TED compaction;
                                      needs ``h5py`` (``pip install 'tdreplay-storages[h5]'``)
``ListStorageCheckpointer``           the pickled list of items (default of list storages)
``CompressedListStorageCheckpointer`` the compressed blobs as they are, one file, plus a table of
                                      row structures (default of ``CompressedListStorage``)
===================================== =============================================================

TED compaction
--------------
In TorchRL's TED format a transition holds ``obs`` and ``("next", "obs")``; within a
trajectory ``("next", "obs")`` of step ``t`` is ``obs`` of step ``t + 1``, so saving both
nearly doubles the observations on disk. The flat, nested and H5 checkpointers save each
such ``("next", key)`` entry as only the steps where it is *not* the next step's root entry
(trajectory ends, the write cursor, the last step), plus a boolean mask of those steps. The
comparison is bitwise and made when saving, so the compaction is lossless whatever the data:
unlike TorchRL's checkpointers, nothing is assumed about done states or the absence of
multi-step transforms. Steps follow the last storage dimension (``ndim > 1``: the time dimension
of ``[rows, time]`` storages; ``ndim == 1``: consecutive rows). Entries named in ``done_keys``
and ``reward_keys`` are always saved whole.

Every checkpointer writes ``storage.json`` naming itself; loading with another checkpointer
raises a :class:`~tdreplay.core.CheckpointError` saying which one to set.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from tdreplay.core import (
    DEFAULT_DONE_KEYS,
    ListStorageCheckpointer,
    Storage,
    StorageCheckpointerBase,
)
from tdreplay.core.checkpoint import CheckpointError, named_write_error, read_json, write_json
from tdreplay.core.file_room import reserve_file
from tdreplay.core.utils import is_int

from ._codec_check import (
    RowCodec,
    blob_checksums,
    check_blob_checksums,
    check_row_checksums,
    row_checksums,
)
from ._compressed_rows import CompressedRow
from ._file_writes import memmap_by_writes, write_array_file, write_json_file
from ._layout import (
    as_key,
    dtype_from_str,
    key_path,
    leaf_keys,
    nested_batch_dims,
    set_nested_batch_dims,
)
from ._object_values import add_non_tensor, non_tensor_keys, split_non_tensor
from ._row_records import layout_from_record, layout_record
from .ted_hooks import Flat2TED, TED2Flat
from .ted_nested import H5Combine

__all__ = [
    "CompressedListStorageCheckpointer",
    "FlatStorageCheckpointer",
    "H5StorageCheckpointer",
    "ListStorageCheckpointer",
    "NestedStorageCheckpointer",
    "TensorStorageCheckpointer",
]

DEFAULT_REWARD_KEYS = ("reward",)

# dtypes numpy (and h5py) cannot hold are saved as same-size integers and viewed back
_NUMPY_STANDIN = {torch.bfloat16: torch.int16, torch.float8_e4m3fn: torch.uint8,
                  torch.float8_e5m2: torch.uint8}


def _stored_path(key: tuple[str, ...]) -> tuple[str, ...]:
    """Where an array is saved: compaction parts go beside their key (``("next", "obs@mask")``)."""
    return key[:-2] + (key[-2] + key[-1],) if key[-1].startswith("@") else key


def _h5_name(part: str) -> str:
    """A key part as an HDF5 link name: ``/`` separates groups and ``.`` / ``""`` name none,
    so ``%`` escapes them (and itself); the checkpoint's index records the name used.

    Examples
    --------
    >>> [_h5_name(p) for p in ("obs", "a/b", ".", "", "5%")]
    ['obs', 'a%2Fb', '%2E', '%00', '5%25']
    """
    name = part.replace("%", "%25").replace("/", "%2F")
    return {"": "%00", ".": "%2E"}.get(name, name)


def _dtype_from_str(name: str) -> torch.dtype:
    try:
        return dtype_from_str(name)
    except ValueError:
        raise CheckpointError(f"checkpoint names an unknown dtype {name!r}.") from None


def _to_numpy(tensor: torch.Tensor) -> np.ndarray:
    tensor = tensor.detach().cpu().contiguous()
    standin = _NUMPY_STANDIN.get(tensor.dtype)
    if standin is not None:
        tensor = tensor.view(standin)
    return tensor.numpy()


def _from_numpy(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    standin = _NUMPY_STANDIN.get(dtype)
    return tensor.view(dtype) if standin is not None else tensor


@runtime_checkable
class TensorLayoutStorage(Protocol):
    """What the tensor checkpointers need of a storage (``TensorStorage`` and its subclasses).

    The checkpointers read and install a storage only through these public members, so a
    storage module imports its checkpointer and never the other way round.

    Examples
    --------
    >>> from tdreplay.storages import LazyTensorStorage, ListStorage
    >>> isinstance(LazyTensorStorage(4), TensorLayoutStorage)
    True
    >>> isinstance(ListStorage(4), TensorLayoutStorage)
    False
    """

    @property
    def max_size(self) -> int: ...

    @property
    def ndim(self) -> int: ...

    @property
    def initialized(self) -> bool: ...

    def layout_meta(self) -> dict[str, Any]: ...

    def written_rows(self) -> TensorDictBase: ...

    def check_layout_compatible(self, meta: dict[str, Any], data: TensorDictBase) -> None: ...

    def install(self, meta: dict[str, Any], data: TensorDictBase) -> None: ...

    def empty(self) -> None: ...


@runtime_checkable
class CompressedRowStorage(Protocol):
    """What :class:`CompressedListStorageCheckpointer` needs of a storage
    (``CompressedListStorage``): its rows as :class:`CompressedRow` and its codec.

    Examples
    --------
    >>> from tdreplay.storages import CompressedListStorage, ListStorage
    >>> isinstance(CompressedListStorage(4), CompressedRowStorage)
    True
    >>> isinstance(ListStorage(4), CompressedRowStorage)
    False
    """

    @property
    def max_size(self) -> int: ...

    codec: RowCodec

    def codec_for(self, saved: Any) -> RowCodec: ...

    def items(self) -> list[Any]: ...

    def replace_items(self, items: Sequence[Any]) -> None: ...


def _tensor_storage(storage: Storage, checkpointer: StorageCheckpointerBase) -> TensorLayoutStorage:
    """``storage`` as a :class:`TensorLayoutStorage`; ``TypeError`` when it is not one."""
    if not isinstance(storage, TensorLayoutStorage):
        raise TypeError(f"{type(checkpointer).__name__} saves tensor storages (TensorStorage, "
                        f"LazyTensorStorage, LazyMemmapStorage), not {type(storage).__name__}.")
    return storage


def _compressed_storage(storage: Storage,
                        checkpointer: StorageCheckpointerBase) -> CompressedRowStorage:
    """``storage`` as a :class:`CompressedRowStorage`; ``TypeError`` when it is not one."""
    if not isinstance(storage, CompressedRowStorage):
        raise TypeError(f"{type(checkpointer).__name__} saves CompressedListStorage, not "
                        f"{type(storage).__name__}.")
    return storage


def hooked_rows(checkpointer: StorageCheckpointerBase, rows: TensorDictBase,
                path: Path) -> TensorDictBase:
    """A storage's written ``rows`` passed through ``checkpointer``'s save hooks (given
    ``path``), before anything is written; ``TypeError`` when the hooks return no
    TensorDict."""
    if not checkpointer.save_hooks:
        return rows
    out = checkpointer.apply_save_hooks(rows, path=path)
    if not isinstance(out, TensorDictBase):
        raise TypeError(f"the save hooks of {type(checkpointer).__name__} returned a "
                        f"{type(out).__name__}; it saves a TensorDict (nothing was written).")
    return out


def write_rows(rows: TensorDictBase, path: Path, meta: dict[str, Any]) -> None:
    """Write ``rows`` into ``path / "data"`` (memory-mapped files, non-tensor entries as JSON
    beside them) and record the files in ``meta`` (the checkpoint's ``storage.json``)."""
    tensors, columns = split_non_tensor(rows)
    memmap_by_writes(tensors, path / "data")  # OSError on a full disk, not SIGBUS
    meta["files"] = file_table(path / "data")
    if columns is not None:  # (absent otherwise: checkpoints of tensors unchanged)
        write_json_file(path / NON_TENSOR_FILE, columns)
        meta["non_tensor"] = NON_TENSOR_FILE


def read_rows(path: Path, meta: dict[str, Any], what: str) -> TensorDictBase:
    """The rows :func:`write_rows` wrote into ``path`` (``meta``: its ``storage.json``), file
    sizes checked first (``load_memmap`` would zero-extend a truncated file);
    :class:`~tdreplay.core.CheckpointError` naming ``what`` checkpoint otherwise."""
    check_file_table(path / "data", meta.get("files", {}))
    try:
        loaded = TensorDict.load_memmap(path / "data")
    except (OSError, KeyError, ValueError, TypeError, RuntimeError) as err:
        raise CheckpointError(f"cannot read the {what} checkpoint in {str(path)!r}: "
                              f"{type(err).__name__}: {err}") from err
    if "non_tensor" in meta:
        add_non_tensor(loaded, read_json(path / NON_TENSOR_FILE))
    return loaded


def _check_written_by(meta: dict[str, Any], checkpointer: StorageCheckpointerBase) -> None:
    written_by = meta.get("checkpointer", "TensorStorageCheckpointer")
    if written_by != type(checkpointer).__name__:
        raise CheckpointError(
            f"this storage was saved by {written_by} but the storage's checkpointer is a "
            f"{type(checkpointer).__name__}: set storage.checkpointer = {written_by}(...) "
            "before loading."
        )


def _check_meta(storage: TensorLayoutStorage, meta: dict[str, Any]) -> None:
    for name in ("max_size", "ndim"):
        if meta.get(name) != getattr(storage, name):
            raise CheckpointError(f"checkpoint storage has {name}={meta.get(name)} but this "
                                  f"storage has {name}={getattr(storage, name)}.")


def file_table(root: Path) -> dict[str, int]:
    """Size of every file under ``root`` (saved with a checkpoint, checked by
    :func:`check_file_table` before ``TensorDict.load_memmap``, which silently zero-extends a
    truncated file)."""
    return {p.relative_to(root).as_posix(): p.stat().st_size
            for p in sorted(root.rglob("*")) if p.is_file()}


def check_file_table(root: Path, table: dict[str, int]) -> None:
    """Raise :class:`CheckpointError` when a file of ``table`` is missing or of another size."""
    for rel, size in table.items():
        file = root / rel
        if not file.is_file():
            raise CheckpointError(f"checkpoint file {str(file)!r} is missing.")
        found = file.stat().st_size
        if found != size:
            raise CheckpointError(f"checkpoint file {str(file)!r} holds {found} bytes, expected "
                                  f"{size}: truncated or altered.")


#: The file of a checkpoint holding the non-tensor entries of the rows, as JSON.
NON_TENSOR_FILE = "non_tensor.json"


def _refuse_non_tensor(data: TensorDictBase, checkpointer: StorageCheckpointerBase) -> None:
    """``TypeError`` naming the first non-tensor entry of ``data`` (rows to save): the
    checkpointer saves tensors only."""
    keys = non_tensor_keys(data)
    if keys:
        raise TypeError(f"entry {keys[0]!r} is a {type(data.get(keys[0])).__name__}: "
                        f"{type(checkpointer).__name__} saves tensor entries only (arrays of "
                        "fixed dtype); save a storage with non-tensor entries with the default "
                        "TensorStorageCheckpointer, which keeps them as JSON.")


class TensorStorageCheckpointer(StorageCheckpointerBase):
    """Saves a tensor storage's written rows as memory-mapped files (TensorDict's format).

    The default checkpointer of :class:`~tdreplay.storages.TensorStorage`,
    :class:`~tdreplay.storages.LazyTensorStorage` and
    :class:`~tdreplay.storages.LazyMemmapStorage`. Only the written rows are saved (in
    ``data/``, readable with ``TensorDict.load_memmap``); loading checks the layout (keys,
    shapes, ``max_size``, ``ndim``) against the target storage before anything changes.
    Non-tensor entries (strings and other JSON values) are saved as JSON in
    ``non_tensor.json``, named by ``storage.json``; nothing is pickled.

    Examples
    --------
    >>> import tempfile
    >>> from tensordict import TensorDict
    >>> from tdreplay.storages import LazyTensorStorage
    >>> s = LazyTensorStorage(10)
    >>> s.set(slice(0, 3), TensorDict({"obs": torch.arange(3.)}, [3]))
    >>> with tempfile.TemporaryDirectory() as d:
    ...     s.dumps(d)
    ...     t = LazyTensorStorage(10)
    ...     t.loads(d)
    >>> len(t), t[:]["obs"].tolist()
    (3, [0.0, 1.0, 2.0])
    """

    def dumps(self, storage: Storage, path: Path) -> None:
        source = _tensor_storage(storage, self)
        path = Path(path)
        meta = source.layout_meta()
        meta["checkpointer"] = type(self).__name__
        if source.initialized:
            write_rows(hooked_rows(self, source.written_rows(), path), path, meta)
        write_json(path / "storage.json", meta)

    def prepare_load(self, storage: Storage, path: Path) -> Callable[[], None]:
        target = _tensor_storage(storage, self)
        path = Path(path)
        meta = read_json(path / "storage.json")
        _check_written_by(meta, self)
        _check_meta(target, meta)
        if not meta["initialized"]:
            return target.empty
        loaded = self.apply_load_hooks(read_rows(path, meta, "tensor storage"))
        target.check_layout_compatible(meta, loaded)

        def commit() -> None:
            target.install(meta, loaded)

        return commit


# ---- TED compaction ----------------------------------------------------------------------------
def _bits(tensor: torch.Tensor, batch_dims: int) -> torch.Tensor:
    """Bytes of each element of the batch, for bitwise comparison: ``[*batch, nbytes]``."""
    flat = tensor.contiguous().reshape(*tensor.shape[:batch_dims], -1)
    return flat.view(torch.uint8) if flat.dtype is not torch.uint8 else flat


def _time_dim(ndim: int, batch_dims: int) -> int:
    """The dim of a storage's written rows (``batch_dims`` of them) along which the steps of a
    trajectory follow each other, which TED compaction runs along: dim 0 of a storage with
    ``ndim`` > 1 (laid out ``[time, envs]``), else the last (items that are trajectories,
    ``[rows, steps]``; dim 0 for items of one step).

    >>> _time_dim(1, 1), _time_dim(1, 2), _time_dim(2, 2)
    (0, 1, 0)
    """
    return 0 if ndim > 1 else batch_dims - 1


class _Compactor:
    """Lossless compaction of ``("next", key)`` entries that repeat the next step's ``key``."""

    def __init__(self, done_keys: Iterable[Any] | None, reward_keys: Iterable[Any] | None) -> None:
        self.done_keys = tuple(DEFAULT_DONE_KEYS if done_keys is None else done_keys)
        self.reward_keys = tuple(DEFAULT_REWARD_KEYS if reward_keys is None else reward_keys)
        self._excluded = {key_path(k) for k in self.done_keys + self.reward_keys}

    def _excluded_key(self, path: tuple[str, ...]) -> bool:
        return path in self._excluded or (path[-1],) in self._excluded

    def compact(self, data: TensorDictBase, dim: int
                ) -> tuple[dict[tuple[str, ...], torch.Tensor], list[dict[str, Any]]]:
        """Split ``data`` (batch ``[rows, *inner]``) into arrays to save and their description;
        ``dim``: the batch dim along which steps follow each other (see :func:`_time_dim`)."""
        batch_dims = data.batch_dims
        steps = data.batch_size[dim]
        arrays: dict[tuple[str, ...], torch.Tensor] = {}
        entries: list[dict[str, Any]] = []
        keys = [key_path(k) for k in leaf_keys(data)]
        key_set = set(keys)
        for path in keys:
            value = data.get(as_key(path))
            entry: dict[str, Any] = {"key": list(path), "dtype": str(value.dtype),
                                     "shape": list(value.shape), "stored": "full"}
            source = path[1:]
            if (path[0] == "next" and len(path) > 1 and source[0] != "next"
                    and source in key_set and not self._excluded_key(source) and steps > 1
                    and value.numel() > 0):
                root = data.get(as_key(source))
                if root.shape == value.shape and root.dtype == value.dtype:
                    same = (_bits(value, batch_dims).narrow(dim, 0, steps - 1)
                            == _bits(root, batch_dims).narrow(dim, 1, steps - 1)).all(-1)
                    mask = torch.ones(data.batch_size, dtype=torch.bool)
                    mask.narrow(dim, 0, steps - 1).copy_(~same)
                    if not bool(mask.all()):
                        entry.update(stored="shifted", source=list(source),
                                     explicit=int(mask.sum()))
                        arrays[path + ("@mask",)] = mask
                        arrays[path + ("@explicit",)] = value[mask]
                        entries.append(entry)
                        continue
            arrays[path] = value
            entries.append(entry)
        return arrays, entries

    @staticmethod
    def expand(arrays: dict[tuple[str, ...], torch.Tensor], entries: list[dict[str, Any]],
               batch_size: torch.Size, dim: int) -> TensorDict:
        """Rebuild the rows from what :meth:`compact` saved along ``dim`` (checking every
        shape)."""
        batch_dims = len(batch_size)
        steps = batch_size[dim]
        out = TensorDict(batch_size=batch_size)
        shifted = []
        for entry in entries:
            path = tuple(entry["key"])
            dtype = _dtype_from_str(entry["dtype"])
            shape = torch.Size(entry["shape"])
            if shape[:batch_dims] != batch_size:
                raise CheckpointError(f"checkpoint entry {path} has shape {tuple(shape)}, not "
                                      f"batched like the storage rows {tuple(batch_size)}.")
            if entry["stored"] == "full":
                value = arrays[path]
                if value.shape != shape or value.dtype != dtype:
                    raise CheckpointError(f"checkpoint entry {path} holds {value.dtype} "
                                          f"{tuple(value.shape)}; its description says {dtype} "
                                          f"{tuple(shape)}.")
                out.set(as_key(path), value)
            elif entry["stored"] == "shifted":
                shifted.append((path, dtype, shape, entry))
            else:
                raise CheckpointError(f"checkpoint entry {path} is stored as "
                                      f"{entry['stored']!r}, which this version cannot read.")
        for path, dtype, shape, entry in shifted:
            source = tuple(entry["source"])
            root = out.get(as_key(source), None)
            mask = arrays[path + ("@mask",)]
            explicit = arrays[path + ("@explicit",)]
            if root is None or root.shape != shape or root.dtype != dtype:
                raise CheckpointError(f"checkpoint entry {path} is saved relative to {source}, "
                                      "which is missing or of another shape/dtype.")
            if mask.dtype is not torch.bool or mask.shape != batch_size:
                raise CheckpointError(f"checkpoint mask of {path} has shape {tuple(mask.shape)}, "
                                      f"expected {tuple(batch_size)}.")
            count = int(mask.sum())
            if count != entry["explicit"] or explicit.shape != (count, *shape[batch_dims:]) \
                    or explicit.dtype != dtype:
                raise CheckpointError(f"checkpoint entry {path} holds {tuple(explicit.shape)} "
                                      f"explicit steps for {count} masked steps.")
            value = torch.empty(shape, dtype=dtype)
            value.narrow(dim, 0, steps - 1).copy_(root.narrow(dim, 1, steps - 1))
            value[mask] = explicit
            out.set(as_key(path), value)
        return out


class _CompactingCheckpointer(StorageCheckpointerBase):
    """Shared logic of the flat, nested and H5 checkpointers: metadata, compaction, checks.

    Subclasses implement :meth:`_write_arrays` and :meth:`_read_arrays`.
    """

    def __init__(self, done_keys: Iterable[Any] | None = None,
                 reward_keys: Iterable[Any] | None = None) -> None:
        super().__init__()
        self._compactor = _Compactor(done_keys, reward_keys)

    @property
    def done_keys(self) -> tuple[Any, ...]:
        """Entries saved whole (never replaced by the next step's root entry)."""
        return self._compactor.done_keys

    @property
    def reward_keys(self) -> tuple[Any, ...]:
        """Entries saved whole (never replaced by the next step's root entry)."""
        return self._compactor.reward_keys

    def register_save_hook(self, hook: Callable[..., Any]) -> None:
        """Register a save hook (see :meth:`StorageCheckpointerBase.register_save_hook`); the
        TED format hooks (``TED2Flat``, ``TED2Nested``, ``H5Split``) are refused
        (``ValueError``): this checkpointer compacts TED data itself and saves rows, not
        their output.

        Examples
        --------
        >>> from tdreplay.storages import TED2Flat
        >>> FlatStorageCheckpointer().register_save_hook(TED2Flat())  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: FlatStorageCheckpointer compacts TED data itself ...
        """
        _refuse_ted_hook(self, hook, TED2Flat)
        super().register_save_hook(hook)

    def register_load_hook(self, hook: Callable[..., Any]) -> None:
        """Register a load hook; the TED format hooks (``Flat2TED``, ``Nested2TED``,
        ``H5Combine``) are refused (``ValueError``), as by :meth:`register_save_hook`."""
        _refuse_ted_hook(self, hook, (Flat2TED, H5Combine))
        super().register_load_hook(hook)

    def _write_arrays(self, path: Path, arrays: dict[tuple[str, ...], torch.Tensor]) -> dict:
        raise NotImplementedError

    def _read_arrays(self, path: Path, index: dict) -> dict[tuple[str, ...], torch.Tensor]:
        raise NotImplementedError

    def dumps(self, storage: Storage, path: Path) -> None:
        source = _tensor_storage(storage, self)
        path = Path(path)
        meta = source.layout_meta()
        meta["checkpointer"] = type(self).__name__
        if source.initialized:
            written = hooked_rows(self, source.written_rows(), path)
            _refuse_non_tensor(written, self)  # (before anything is written)
            dim = _time_dim(meta["ndim"], written.batch_dims)
            arrays, entries = self._compactor.compact(written, dim)
            meta["batch_size"] = list(written.batch_size)
            meta["time_dim"] = dim
            meta["nested_dims"] = [[list(level), list(dims)]
                                   for level, dims in nested_batch_dims(written).items()]
            meta["entries"] = entries
            meta["arrays"] = self._write_arrays(path, arrays)
        write_json(path / "storage.json", meta)

    def prepare_load(self, storage: Storage, path: Path) -> Callable[[], None]:
        target = _tensor_storage(storage, self)
        path = Path(path)
        meta = read_json(path / "storage.json")
        _check_written_by(meta, self)
        _check_meta(target, meta)
        if not meta["initialized"]:
            return target.empty
        try:
            arrays = self._read_arrays(path, meta["arrays"])
            batch_size = torch.Size(meta["batch_size"])
            # (saved without it: by a version that compacted along the last batch dim)
            dim = meta.get("time_dim", len(batch_size) - 1)
            if not is_int(dim) or not 0 <= dim < len(batch_size):
                raise CheckpointError(f"checkpoint time_dim {dim!r} is not a dim of its rows "
                                      f"{tuple(batch_size)}.")
            data = _Compactor.expand(arrays, meta["entries"], batch_size, int(dim))
            set_nested_batch_dims(data, {tuple(level): tuple(dims)
                                         for level, dims in meta.get("nested_dims", [])})
        except CheckpointError:
            raise
        except (OSError, KeyError, ValueError, TypeError, RuntimeError) as err:
            raise CheckpointError(f"cannot read the {type(self).__name__} checkpoint in "
                                  f"{str(path)!r}: {type(err).__name__}: {err}") from err
        data = self.apply_load_hooks(data)
        target.check_layout_compatible(meta, data)
        return lambda: target.install(meta, data)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(done_keys={self.done_keys}, "
                f"reward_keys={self.reward_keys})")


def _refuse_ted_hook(checkpointer: StorageCheckpointerBase, hook: Any,
                     kinds: type | tuple[type, ...]) -> None:
    """``ValueError`` if ``hook`` is one of the TED format hooks ``kinds``, which a compacting
    ``checkpointer`` does not take (it would be handed their output in place of rows)."""
    if isinstance(hook, kinds):
        name = type(checkpointer).__name__
        raise ValueError(f"{name} compacts TED data itself (each repeated ('next', ...) entry "
                         f"is saved once): the hook {type(hook).__name__} would hand it data in "
                         "another format. Leave the hook out, or register it with a "
                         "TensorStorageCheckpointer (the default) for the TED format's files; "
                         "nothing was registered.")


class FlatStorageCheckpointer(_CompactingCheckpointer):
    """Saves a tensor storage as one level of raw files, one per leaf, TED-compacted.

    Every leaf becomes ``<key joined by dots>.bin`` (raw little-endian bytes, C order) in
    the checkpoint directory; ``storage.json`` lists each file's key, dtype and shape, so the
    files are readable with ``numpy.fromfile`` alone. ``("next", key)`` entries that repeat
    the next step's ``key`` are saved compacted (see :mod:`~tdreplay.storages.checkpointers`).

    Parameters
    ----------
    done_keys, reward_keys : sequence of keys, optional
        Entries never compacted (TorchRL's defaults: ``("done", "truncated", "terminated")``
        and ``("reward",)``).

    Examples
    --------
    >>> import tempfile, os
    >>> from tensordict import TensorDict
    >>> from tdreplay.core.checkpoint import verify_checkpoint
    >>> from tdreplay.storages import LazyTensorStorage
    >>> obs = torch.arange(11.).unsqueeze(-1)
    >>> data = TensorDict({"obs": obs[:-1], ("next", "obs"): obs[1:]}, [10])
    >>> s = LazyTensorStorage(10, checkpointer=FlatStorageCheckpointer())
    >>> s.set(slice(0, 10), data)
    >>> with tempfile.TemporaryDirectory() as d:
    ...     s.dumps(d)
    ...     files = sorted(os.listdir(verify_checkpoint(d)))  # (the snapshot written)
    ...     t = LazyTensorStorage(10, checkpointer=FlatStorageCheckpointer())
    ...     t.loads(d)
    >>> files  # doctest: +NORMALIZE_WHITESPACE
    ['manifest.json', 'next.obs@explicit.bin', 'next.obs@mask.bin', 'obs.bin', 'seam.json',
     'storage.json']
    >>> bool((t[:]["next", "obs"] == obs[1:]).all())
    True
    """

    def _write_arrays(self, path: Path, arrays: dict[tuple[str, ...], torch.Tensor]) -> dict:
        index = {}
        used = {"storage.json"}
        for i, (key, tensor) in enumerate(arrays.items()):
            name = ".".join(_stored_path(key)).replace("/", "_").replace("\\", "_") + ".bin"
            if name in used or name.startswith("."):
                name = f"{i:04d}-{name}"
            used.add(name)
            write_array_file(path / name, np.ascontiguousarray(_to_numpy(tensor)))
            index[name] = {"key": list(key), "dtype": str(tensor.dtype),
                           "shape": list(tensor.shape)}
        return index

    def _read_arrays(self, path: Path, index: dict) -> dict[tuple[str, ...], torch.Tensor]:
        arrays = {}
        for name, info in index.items():
            dtype = _dtype_from_str(info["dtype"])
            shape = torch.Size(info["shape"])
            file = path / name
            if not file.is_file():
                raise CheckpointError(f"checkpoint file {str(file)!r} is missing.")
            raw = np.fromfile(file, dtype=np.uint8)
            expected = shape.numel() * torch.empty((), dtype=dtype).element_size()
            if raw.size != expected:
                raise CheckpointError(f"checkpoint file {str(file)!r} holds {raw.size} bytes, "
                                      f"expected {expected} for {dtype} {tuple(shape)}.")
            # a tensor of no elements (a storage emptied before saving) has no bytes to view
            arrays[tuple(info["key"])] = (torch.from_numpy(raw).view(dtype).reshape(shape)
                                          if raw.size else torch.empty(shape, dtype=dtype))
        return arrays


class NestedStorageCheckpointer(_CompactingCheckpointer):
    """Saves a tensor storage as a TensorDict memmap directory tree, TED-compacted.

    Nested keys become nested directories (``next/obs.memmap``), readable with
    ``TensorDict.load_memmap(path / "data")``; compacted ``("next", key)`` entries are saved
    as ``key@explicit`` and ``key@mask`` beside where ``key`` would be.

    Parameters
    ----------
    done_keys, reward_keys : sequence of keys, optional
        Entries never compacted (see :class:`FlatStorageCheckpointer`).

    Examples
    --------
    >>> import tempfile
    >>> from tensordict import TensorDict
    >>> from tdreplay.core.checkpoint import verify_checkpoint
    >>> from tdreplay.storages import LazyTensorStorage
    >>> obs = torch.arange(11.).unsqueeze(-1)
    >>> data = TensorDict({"obs": obs[:-1], ("next", "obs"): obs[1:]}, [10])
    >>> s = LazyTensorStorage(10, checkpointer=NestedStorageCheckpointer())
    >>> s.set(slice(0, 10), data)
    >>> with tempfile.TemporaryDirectory() as d:
    ...     s.dumps(d)
    ...     on_disk = TensorDict.load_memmap(verify_checkpoint(d) / "data")
    ...     t = LazyTensorStorage(10, checkpointer=NestedStorageCheckpointer())
    ...     t.loads(d)
    >>> sorted(on_disk["next"].keys())
    ['obs@explicit', 'obs@mask']
    >>> bool((t[:]["next", "obs"] == obs[1:]).all())
    True
    """

    def _write_arrays(self, path: Path, arrays: dict[tuple[str, ...], torch.Tensor]) -> dict:
        tree = TensorDict()
        index = {}
        for i, (key, tensor) in enumerate(arrays.items()):
            stored = _stored_path(key)
            tree.set(as_key(stored), tensor.contiguous())
            index[str(i)] = {"key": list(key), "stored": list(stored)}
        memmap_by_writes(tree, path / "data")
        return {"arrays": index, "files": file_table(path / "data")}

    def _read_arrays(self, path: Path, index: dict) -> dict[tuple[str, ...], torch.Tensor]:
        data_dir = path / "data"
        if not data_dir.is_dir():
            raise CheckpointError(f"checkpoint directory {str(data_dir)!r} is missing.")
        check_file_table(data_dir, index["files"])
        tree = TensorDict.load_memmap(data_dir)
        arrays = {}
        for info in index["arrays"].values():
            value = tree.get(as_key(info["stored"]), None)
            if value is None:
                raise CheckpointError(f"checkpoint entry {info['stored']} is missing.")
            arrays[tuple(info["key"])] = value.as_subclass(torch.Tensor).clone()
        return arrays


#: bytes an HDF5 file takes beyond its data: for the file (superblock, root group) and per
#: dataset (object header, chunk index), bounds for reserve_file
_H5_FILE_OVERHEAD, _H5_DATASET_OVERHEAD = 1 << 16, 1 << 13


class H5StorageCheckpointer(_CompactingCheckpointer):
    """Saves a tensor storage in one HDF5 file, TED-compacted.

    Groups mirror nested keys (``/next/obs``); compacted ``("next", key)`` entries are saved as
    datasets ``key@explicit`` and ``key@mask``. A key part that is no HDF5 name is escaped with
    ``%`` (``"a/b"`` as ``a%2Fb``, ``"."`` as ``%2E``, ``""`` as ``%00``, ``%`` as ``%25``).
    Needs ``h5py``: install the ``h5`` extra (``pip install 'tdreplay-storages[h5]'``).

    Parameters
    ----------
    checkpoint_file : str
        Name of the HDF5 file inside the checkpoint directory. Defaults to ``"checkpoint.h5"``.
    done_keys, reward_keys : sequence of keys, optional
        Entries never compacted (see :class:`FlatStorageCheckpointer`).
    h5_kwargs : dict, optional
        Passed to ``h5py.Group.create_dataset`` (e.g. ``{"compression": "gzip"}``).

    Examples
    --------
    >>> import tempfile
    >>> from tensordict import TensorDict
    >>> from tdreplay.storages import LazyTensorStorage
    >>> data = TensorDict({"obs": torch.randn(6, 3), ("next", "reward"): torch.ones(6, 1)}, [6])
    >>> ckpt = H5StorageCheckpointer(h5_kwargs={"compression": "gzip"})
    >>> s = LazyTensorStorage(6, checkpointer=ckpt)
    >>> s.set(slice(0, 6), data)
    >>> with tempfile.TemporaryDirectory() as d:
    ...     s.dumps(d)
    ...     t = LazyTensorStorage(6, checkpointer=H5StorageCheckpointer())
    ...     t.loads(d)
    >>> bool((t[:]["obs"] == data["obs"]).all())
    True
    """

    def __init__(self, *, checkpoint_file: str = "checkpoint.h5",
                 done_keys: Iterable[Any] | None = None, reward_keys: Iterable[Any] | None = None,
                 h5_kwargs: dict[str, Any] | None = None) -> None:
        try:
            import h5py  # noqa: F401
        except ImportError as err:
            raise ImportError(
                "H5StorageCheckpointer needs h5py, an optional dependency: install it with "
                "`pip install 'tdreplay-storages[h5]'`."
            ) from err
        super().__init__(done_keys, reward_keys)
        if not isinstance(checkpoint_file, str) or not checkpoint_file or "/" in checkpoint_file:
            raise ValueError(f"checkpoint_file must be a file name, got {checkpoint_file!r}.")
        self.checkpoint_file = checkpoint_file
        self.h5_kwargs = dict(h5_kwargs or {})

    def _write_arrays(self, path: Path, arrays: dict[tuple[str, ...], torch.Tensor]) -> dict:
        import h5py

        index = {}
        stored_of = {key: tuple(map(_h5_name, _stored_path(key))) for key in arrays}
        owner: dict[tuple[str, ...], tuple[str, ...]] = {}
        for key, stored in stored_of.items():  # (before the file: h5py's error names none)
            other = owner.setdefault(stored, key)
            if other != key:
                raise CheckpointError(
                    f"entries {other!r} and {key!r} would both be saved as the HDF5 dataset "
                    f"{'/'.join(stored)!r} (a last key part starting with '@' names a TED "
                    "compaction part): rename one, or use another checkpointer.")
        target = path / self.checkpoint_file
        # the room for the uncompressed data (an upper bound), checked before HDF5 writes: it
        # crashes the process on some failed writes where this raises OSError (reserve_file)
        reserve_file(target, sum(t.numel() * t.element_size() for t in arrays.values())
                     + _H5_FILE_OVERHEAD + _H5_DATASET_OVERHEAD * len(arrays))
        with h5py.File(target, "w") as f:
            for i, (key, tensor) in enumerate(arrays.items()):
                stored = stored_of[key]
                array = _to_numpy(tensor)
                # compression filters need at least one dimension
                kwargs = self.h5_kwargs if array.ndim else {}
                f.create_dataset("/".join(stored), data=array, **kwargs)
                index[str(i)] = {"key": list(key), "stored": list(stored),
                                 "dtype": str(tensor.dtype)}
        return index

    def _read_arrays(self, path: Path, index: dict) -> dict[tuple[str, ...], torch.Tensor]:
        import h5py

        file = path / self.checkpoint_file
        if not file.is_file():
            raise CheckpointError(f"checkpoint file {str(file)!r} is missing.")
        arrays = {}
        with h5py.File(file, "r") as f:
            for info in index.values():
                name = "/".join(info["stored"])
                if name not in f:
                    raise CheckpointError(f"dataset {name!r} is missing from {str(file)!r}.")
                dtype = _dtype_from_str(info["dtype"])
                arrays[tuple(info["key"])] = _from_numpy(f[name][()], dtype)
        return arrays

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(checkpoint_file={self.checkpoint_file!r}, "
                f"done_keys={self.done_keys}, reward_keys={self.reward_keys}, "
                f"h5_kwargs={self.h5_kwargs})")


#: The file of a compressed storage's checkpoint holding the CRC-32 of each row's compressed
#: bytes (int64, one a row), named by ``storage.json``'s ``"blob_crc"``.
BLOB_CRC_FILE = "blob_crc.bin"


class CompressedListStorageCheckpointer(StorageCheckpointerBase):
    """Checkpointer of :class:`~tdreplay.storages.CompressedListStorage`: the blobs as they are.

    Rows are not decompressed: ``blobs.bin`` holds every compressed row back to back,
    ``offsets.bin`` (int64, ``len + 1`` values) where each starts, ``row_layouts.bin`` (int32)
    which structure each row has, ``blob_crc.bin`` (int64) the CRC-32 of each row's bytes, and
    ``storage.json`` the codec and the table of structures (keys, dtypes, shapes). Nothing is
    unpickled on load; a row whose bytes were damaged is refused before the storage changes. A
    checkpoint is only loaded by a storage with the same codec.

    Save and load hooks are not supported (rows are saved compressed, never decompressed):
    :meth:`register_save_hook` and :meth:`register_load_hook` raise ``NotImplementedError``
    (TorchRL's accepts them and never runs them).

    Examples
    --------
    >>> import tempfile
    >>> from tdreplay.storages import CompressedListStorage
    >>> s = CompressedListStorage(10)
    >>> s.set(torch.arange(3), torch.arange(12).reshape(3, 4))
    >>> with tempfile.TemporaryDirectory() as d:
    ...     s.dumps(d)
    ...     t = CompressedListStorage(10)
    ...     t.loads(d)
    >>> t.get(torch.tensor([2, 0])).tolist()
    [[8, 9, 10, 11], [0, 1, 2, 3]]
    """

    def _refuse_hook(self, hook: Any) -> None:
        raise NotImplementedError(
            f"{type(self).__name__} saves rows compressed as they are, never decompressed: it "
            f"runs no hook, and hook={hook!r} is refused (nothing was registered). Give the "
            "storage a checkpointer that runs hooks, or transform the rows before writing them.")

    def register_save_hook(self, hook: Callable[..., Any]) -> None:
        """Refused (``NotImplementedError``, nothing registered): rows are saved compressed.

        Examples
        --------
        >>> from tdreplay.storages import CompressedListStorage
        >>> s = CompressedListStorage(4)
        >>> s.register_save_hook(lambda rows: rows)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        NotImplementedError: CompressedListStorageCheckpointer saves rows compressed as ...
        >>> s.save_hooks
        ()
        """
        self._refuse_hook(hook)

    def register_load_hook(self, hook: Callable[..., Any]) -> None:
        """Refused (``NotImplementedError``, nothing registered): rows are loaded compressed."""
        self._refuse_hook(hook)

    def dumps(self, storage: Storage, path: Path) -> None:
        source = _compressed_storage(storage, self)
        if self.save_hooks or self.load_hooks:  # (a subclass that registered some)
            raise RuntimeError("CompressedListStorageCheckpointer saves rows compressed as they "
                               "are: save/load hooks are not supported.")
        path = Path(path)
        rows: list[CompressedRow] = source.items()
        layouts: dict[Any, int] = {}
        row_layouts = np.empty(len(rows), dtype=np.int32)
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        try:  # (a failed write names the file: see named_write_error)
            with open(path / "blobs.bin", "wb") as f:
                for i, row in enumerate(rows):
                    row_layouts[i] = layouts.setdefault(row.layout, len(layouts))
                    f.write(row.blob)
                    offsets[i + 1] = offsets[i] + len(row.blob)
        except OSError as err:
            raise named_write_error(err, path / "blobs.bin") from err
        write_array_file(path / "offsets.bin", np.ascontiguousarray(offsets))
        write_array_file(path / "row_layouts.bin", np.ascontiguousarray(row_layouts))
        write_array_file(path / BLOB_CRC_FILE, blob_checksums(rows).numpy())
        write_json(path / "storage.json", {
            "class": type(storage).__name__,
            "checkpointer": type(self).__name__,
            "max_size": source.max_size,
            "len": len(rows),
            "codec": source.codec.name,
            "row_crc": row_checksums(rows, source.codec),  # (which codec: _codec_check)
            "blob_crc": BLOB_CRC_FILE,  # (every row's compressed bytes, as its state_dict)
            "layouts": [layout_record(layout) for layout in layouts],
        })

    def prepare_load(self, storage: Storage, path: Path) -> Callable[[], None]:
        target = _compressed_storage(storage, self)
        if self.load_hooks:
            raise CheckpointError("CompressedListStorageCheckpointer does not run load hooks.")
        path = Path(path)
        meta = read_json(path / "storage.json")
        _check_written_by(meta, self)
        if meta.get("max_size", target.max_size) != target.max_size:
            # the writer's cursor wraps at max_size: another capacity would not continue alike
            raise CheckpointError(f"checkpoint storage has max_size={meta['max_size']} but this "
                                  f"storage has max_size={target.max_size}.")
        n = int(meta["len"])
        if n > target.max_size:
            raise CheckpointError(f"checkpoint holds {n} rows but the storage max_size is "
                                  f"{target.max_size}.")
        try:
            codec = target.codec_for(meta["codec"])
        except ValueError as err:
            raise CheckpointError(f"checkpoint {err}") from err
        try:
            layouts = [layout_from_record(info) for info in meta["layouts"]]
            offsets = np.fromfile(path / "offsets.bin", dtype=np.int64)
            row_layouts = np.fromfile(path / "row_layouts.bin", dtype=np.int32)
            blobs = (path / "blobs.bin").read_bytes()
            blob_crc = (torch.from_numpy(np.fromfile(path / BLOB_CRC_FILE, dtype=np.int64))
                        if meta.get("blob_crc") is not None else None)  # (None: not recorded)
        except CheckpointError:
            raise
        except (OSError, KeyError, ValueError, TypeError) as err:
            raise CheckpointError(f"cannot read the compressed storage checkpoint in "
                                  f"{str(path)!r}: {type(err).__name__}: {err}") from err
        if offsets.shape != (n + 1,) or row_layouts.shape != (n,):
            raise CheckpointError(f"checkpoint index files do not describe {n} rows.")
        if offsets[0] != 0 or offsets[-1] != len(blobs) or (np.diff(offsets) < 0).any():
            raise CheckpointError("checkpoint offsets do not match blobs.bin (truncated?).")
        if n and (row_layouts.min() < 0 or row_layouts.max() >= len(layouts)):
            raise CheckpointError("checkpoint rows name structures that are not in its table.")
        rows = [CompressedRow(layouts[row_layouts[i]], blobs[offsets[i]: offsets[i + 1]])
                for i in range(n)]
        try:
            check_blob_checksums(rows, blob_crc, BLOB_CRC_FILE)
        except ValueError as err:
            raise CheckpointError(f"checkpoint file {str(path / 'blobs.bin')!r}: {err}") from err
        try:
            check_row_checksums(rows, codec, meta.get("row_crc"), "storage.json 'row_crc'")
        except ValueError as err:
            raise CheckpointError(f"checkpoint in {str(path)!r}: {err}") from err

        def commit() -> None:
            target.replace_items(rows)
            target.codec = codec  # (the other built-in codec, for a checkpoint of it)

        return commit
