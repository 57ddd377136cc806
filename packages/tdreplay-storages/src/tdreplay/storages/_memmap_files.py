"""The files a ``LazyMemmapStorage``'s first write lays out, and their mapping by other processes.

The first write lists the leaf files it creates in the creation file before it creates them
(a first write that fails, or whose process dies, is undone from that list) and then writes
the layout file: each leaf's key, file, dtype and shape, the item format and batch dims.
:class:`MemmapFilesMixin` keeps that record and maps the files another process (or a pickled
original) laid out, after checking them against the layout (:class:`DamagedStorageError`
otherwise). The names of the storage's own files in its scratch directory are here as well:
no leaf file takes one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from stat import S_ISREG
from typing import Any

import torch
from tensordict import MemoryMappedTensor

from tdreplay.core.atomic_files import replace_file
from tdreplay.core.checkpoint import CheckpointError

from ._edit_journal import UNDO_FILE
from ._formats import KIND_TC, DataFormat
from ._layout import TensorLayout, as_key, assemble, build_tree, dtype_from_str, key_path
from ._memmap_shared import _STATE_FILE, _STATE_INIT, _STATE_LEN, _SharedCounters
from ._storage_errors import DamagedStorageError
from ._td_builders import ItemNames
from ._tensorclasses import classes_from_record, classes_record
from ._torn_writes import PLAN_FILE, STAGE_FILE

_CONFIG_FILE = "tdreplay-memmap.json"
_LOCK_FILE = "tdreplay-memmap.lock"
_LAYOUT_FILE = "tdreplay-memmap-layout.json"
_TORN_FILE = "tdreplay-memmap-torn.bin"
_CREATING_FILE = "tdreplay-memmap-creating.json"
_RESERVED = {_CONFIG_FILE, _STATE_FILE, _LOCK_FILE, _LAYOUT_FILE, _TORN_FILE, _CREATING_FILE,
             PLAN_FILE, STAGE_FILE, UNDO_FILE}
_FORMAT = 1


def _dtype_from_str(name: str) -> torch.dtype:
    try:
        return dtype_from_str(name)
    except ValueError:
        raise ValueError(f"unknown dtype {name!r} in a memmap layout file.") from None


def _leaf_filename(key: Any, index: int) -> str:
    """File of a leaf: its key path as directories (``next/obs.memmap``) when safe."""
    parts = key_path(key)
    safe = all(
        part and part not in (".", "..") and "/" not in part and "\\" not in part
        and "\0" not in part and part not in _RESERVED
        for part in parts
    )
    if not safe:
        return f"leaf-{index:04d}.memmap"
    return "/".join(parts) + ".memmap"


def _inside(path: Path, root: Path) -> bool:
    """Whether ``path`` names something under ``root`` (no ``..`` out of it)."""
    return ".." not in path.relative_to(root).parts if path.is_relative_to(root) else False


def _remove_paths(paths: Any) -> None:
    """Remove files, and directories when empty, in the order given (deepest first)."""
    for path in paths:
        try:
            if path.is_dir() and not path.is_symlink():
                path.rmdir()
            else:
                path.unlink(missing_ok=True)
        except OSError:
            pass  # not empty (someone else's files): left


def _read_json(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; :class:`DamagedStorageError` naming the file when it cannot
    be read or parsed (a file that is missing where its storage needs it included)."""
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise DamagedStorageError(f"{str(path)!r} cannot be read as the storage's JSON "
                                  f"record: {err}") from err
    if not isinstance(found, dict):
        raise DamagedStorageError(f"{str(path)!r} does not hold a JSON object.")
    return found


def _item_names(layout: dict[str, Any]) -> ItemNames:
    """The names of the items' own batch dims a layout file records (``None``: unnamed);
    ``ValueError`` when they do not fit its ``item_batch``."""
    names = layout.get("item_names")
    if names is None:
        return None
    if (not isinstance(names, list) or len(names) != len(layout.get("item_batch", []))
            or not all(name is None or isinstance(name, str) for name in names)):
        raise ValueError(f"item_names {names!r} do not name the item dims")
    return tuple(names)


def _check_leaf_file(path: Path, shape: torch.Size, dtype: torch.dtype) -> None:
    """:class:`DamagedStorageError` unless ``path`` exists with the size of a ``shape`` /
    ``dtype`` leaf (mapping it would create or zero-extend it: zeros where rows were)."""
    expected = shape.numel() * torch.empty((), dtype=dtype).element_size()
    try:
        stat = path.stat()
    except FileNotFoundError:
        raise DamagedStorageError(f"the data file {str(path)!r} of this memory-mapped storage "
                                  f"is missing (its layout maps {expected} bytes there): its "
                                  "rows are lost.") from None
    size = stat.st_size
    if not S_ISREG(stat.st_mode):
        raise DamagedStorageError(f"the data file {str(path)!r} of this memory-mapped storage "
                                  "is not a regular file (a directory or a device took its "
                                  "place): its rows are lost.")
    if size < expected:
        raise DamagedStorageError(f"the data file {str(path)!r} of this memory-mapped storage "
                                  f"holds {size} bytes, its layout {expected}: it was "
                                  "truncated, and its rows cannot be trusted.")


def _format_extra(layout: dict[str, Any]) -> Any:
    """The pytree structure, lazy stack or tensorclass of the items a layout file describes
    (:meth:`DataFormat.resolve_extra`), or ``None``: for a tensorclass this process cannot
    import (defined in a function of another process), reads then ask for one item to be
    written here first."""
    try:
        return DataFormat.resolve_extra(layout)
    except CheckpointError:
        if layout["kind"] != KIND_TC:
            raise
        return None


class MemmapFilesMixin:
    """The creation list and the layout file of a memory-mapped storage's first write, and
    the mapping of the files another process laid out (mixed into
    :class:`~tdreplay.storages.LazyMemmapStorage`)."""

    # the storage's attributes read here (annotations only: a class default would slow down
    # every attribute read of the storage, see tdreplay.core.buffer_parts)
    _scratch_dir: Path
    _state: _SharedCounters
    _layout: TensorLayout | None
    _format: DataFormat
    _device: torch.device
    ndim: int
    _created: list[Path]  # (during the first write: see LazyMemmapStorage._create)
    _new_files: list[tuple[Any, str, torch.dtype, tuple[int, ...]]]

    def _current_layout(self) -> TensorLayout | None:
        layout = self._layout
        if layout is None and self._state.array[_STATE_INIT]:
            layout = self._attach_layout()  # laid out by another process (or before pickling)
        return layout

    def _list_created(self) -> None:
        """Write ``self._created`` to the creation file (atomically: whole, or as before)."""
        scratch = self._scratch_dir
        listed = {"pid": os.getpid(),
                  "created": [p.relative_to(scratch).as_posix() for p in self._created]}
        replace_file(scratch / _CREATING_FILE, json.dumps(listed).encode(), durable=False)

    def _remove_created(self) -> None:
        """Remove what a failed first write created (files, then directories deepest first,
        and the creation file; a layout file that failed to be written removed itself): a
        retry finds ``scratch_dir`` as it was."""
        scratch = self._scratch_dir
        _remove_paths(reversed(self._created))
        (scratch / _CREATING_FILE).unlink(missing_ok=True)

    def _remove_dead_creation(self) -> None:
        """Under the lock, before a first write: remove what the first write of a process that
        died before committing the layout created (its creation file lists it; a live
        creator would hold the lock, one that failed removed its files and the list)."""
        scratch = self._scratch_dir
        listing = scratch / _CREATING_FILE
        try:
            created = json.loads(listing.read_text())["created"]
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError):
            created = []  # damaged: nothing is removed (foreign-looking files stay refused)
        paths = [scratch / rel for rel in created if isinstance(rel, str)]
        _remove_paths(reversed([p for p in paths if _inside(p, scratch)]))
        for leftover in (*scratch.glob(f"{_LAYOUT_FILE}.*.tmp"),
                         *scratch.glob(f"{_CREATING_FILE}.*.tmp"), scratch / _LAYOUT_FILE):
            leftover.unlink(missing_ok=True)
        listing.unlink(missing_ok=True)

    def _write_layout(self) -> None:
        assert self._layout is not None
        layout = {
            "format": _FORMAT,
            "shape": list(self._layout.shape),
            "item_batch": list(self._layout.item_batch),  # an item's own batch dims
            # their names (absent: unnamed)
            **({"item_names": list(self._layout.item_names)} if self._layout.item_names else {}),
            "kind": self._format.kind,
            "treespec": self._format.meta()["treespec"],
            "tensorclass": self._format.meta()["tensorclass"],  # where its class is defined
            "lazy_stack": self._format.meta().get("lazy_stack"),  # items stacking ragged parts
            # the batch dims of nested TensorDicts past their parent's (e.g. agents)
            "nested_dims": [[list(path), list(dims)]
                            for path, dims in self._layout.nested_dims.items()],
            # the tensorclasses nested in the data, where they are defined (absent: none)
            **({"nested_tensorclasses": classes_record(self._layout.nested_classes)}
               if self._layout.nested_classes else {}),
            "leaves": [
                {"key": list(key_path(key)), "file": rel,
                 "dtype": str(dtype), "shape": list(shape)}
                for key, rel, dtype, shape in self._new_files
            ],
        }
        replace_file(self._scratch_dir / _LAYOUT_FILE, json.dumps(layout).encode(), durable=False)

    def _attach_layout(self) -> TensorLayout:
        """Map the files another process (or a pickled original) laid out."""
        layout_file = self._scratch_dir / _LAYOUT_FILE
        layout = _read_json(layout_file)
        keys, leaves = [], []
        try:
            entries = [(as_key(leaf["key"]), self._scratch_dir / leaf["file"],
                        _dtype_from_str(leaf["dtype"]), torch.Size(leaf["shape"]))
                       for leaf in layout["leaves"]]
            rows = int(layout["shape"][0])
            names = _item_names(layout)
        except (KeyError, TypeError, ValueError, IndexError) as err:
            raise DamagedStorageError(f"{str(layout_file)!r} is not a layout of this storage "
                                      f"({type(err).__name__}: {err}).") from err
        written = int(self._state.array[_STATE_LEN])
        if not 0 <= written <= rows:
            raise DamagedStorageError(
                f"the state file of {str(self._scratch_dir)!r} counts {written} rows written "
                f"in a storage of {rows}: its counters are damaged.")
        for key, filename, dtype, leaf_shape in entries:
            _check_leaf_file(filename, leaf_shape, dtype)
            mmt = MemoryMappedTensor.from_filename(str(filename), dtype=dtype, shape=leaf_shape)
            keys.append(key)
            leaves.append(mmt.as_subclass(torch.Tensor))
        shape = torch.Size(layout["shape"] + layout.get("item_batch", []))
        self._format = DataFormat(layout["kind"], _format_extra(layout))
        nested = {tuple(path): tuple(dims) for path, dims in layout.get("nested_dims", [])}
        # a nested tensorclass this process cannot import reads as an error naming it
        classes = classes_from_record(layout.get("nested_tensorclasses"), unknown_ok=True)
        self._layout = TensorLayout(assemble(build_tree(keys), leaves, shape, self._device,
                                             nested, names),
                                    self.ndim, self._device, classes)
        return self._layout
