"""``LazyMemmapStorage``: a tensor storage on memory-mapped files, shareable between processes.

Layout of the scratch directory::

    scratch_dir/
      tdreplay-memmap.json          # max_size and ndim the directory was made for
      tdreplay-memmap-state.bin     # int64 counters mapped by every process (see _STATE_*)
      tdreplay-memmap.lock          # flock(2) target: the cross-process write lock
      tdreplay-memmap-layout.json   # written once the first write laid the storage out
      tdreplay-memmap-torn.bin      # rows an overwrite in flight covers (scattered rows only)
      tdreplay-memmap-recovery.bin  # while torn rows are dropped: the plan of the moves
      tdreplay-memmap-staging.bin   #   and the rows of the step under way (_torn_writes.py)
      tdreplay-memmap-undo.bin      # while entries are edited in place: their old values
      tdreplay-memmap-creating.json # during the first write: the files it is creating
      obs.memmap, next/obs.memmap   # one file per leaf, named after its key

Every process that uses the storage (a forked child, a spawned child that received it
pickled, or a process that opened the same ``scratch_dir`` with ``existsok=True``) maps the
same files with ``MAP_SHARED``: rows written by one are read by the others. The number of
written rows and the writer's cursor and write count live in the shared state file, so
``len()``, ``sample()`` and the next ``extend`` of every process agree. Writes and reads go
under a re-entrant lock that is a thread lock in each process plus ``flock`` on the lock
file between processes (released by the kernel if a process dies while holding it).

Crashes: the row count is committed after the data, so the rows of a first write become
visible only once whole. An overwrite of counted rows is recorded before it starts and the
record cleared after; rows a killed writer left half-written are dropped by whoever takes the
lock next (``_torn_writes.py``; the lock checks the record as it is taken, before any count or
row is read: a buffer draws under it), so no process counts or samples a torn row, and a
recovery killed in turn is finished by the next one. An in-place edit of entries (``set_key``,
``update_``, ``storage[tuple] = ...``) journals the old values of its rows first instead:
whoever takes the lock after an editor died writes them back, so no row is left half edited
and none is dropped. A load (``loads``, ``load_state_dict``, ``empty``) journals the old row
count, writer cursor and write count and the counted rows it replaces the same way, kept until
the lock is released: a loader that dies leaves the storage as it was before the load. The
first write (the layout) lists the files it creates in ``tdreplay-memmap-creating.json``
before creating them, and removes the list once the layout is committed: a first write that
finds the list (under the lock, so its writer died) removes those files and lays the storage
out again; files the storage did not create are never overwritten.
"""

from __future__ import annotations

import copy
import errno
import json
import os
import shutil
import tempfile
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tensordict import MemoryMappedTensor

from tdreplay.core import StorageCheckpointerBase
from tdreplay.core.checkpoint import CheckpointError
from tdreplay.core.utils import as_long_tensor, check_flag

from ._edit_journal import UNDO_FILE
from ._formats import KIND_TC, DataFormat
from ._layout import TensorLayout, as_key, assemble, build_tree, dtype_from_str, key_path, leaf_keys
from ._memmap_shared import (
    _STATE_FILE,
    _STATE_INIT,
    _STATE_LEN,
    _STATE_TORN,
    SharedStateMixin,
    _ProcessLock,
    _SharedCounters,
)
from ._tensorclasses import NestedClasses, classes_from_record, classes_record
from ._torn_writes import PACKED_ROWS, PLAN_FILE, STAGE_FILE, TornWrites
from .tensor_storage import LazyTensorStorage

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


def _reserve(filename: Path, nbytes: int) -> None:
    """Reserve the file's blocks now: a full disk (or ``/dev/shm``) fails here with a clear
    error instead of killing a later write into the mapping with SIGBUS."""
    if not nbytes or not hasattr(os, "posix_fallocate"):
        return
    fd = os.open(filename, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except OSError as err:
        if err.errno in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            return  # the file system cannot reserve: fine, the file is already sized
        raise OSError(err.errno, f"cannot reserve {nbytes} bytes for {str(filename)!r} "
                                 f"(memory-mapped storage): {err.strerror}") from err
    finally:
        os.close(fd)


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


class ScratchDirInUseError(FileExistsError, RuntimeError):
    """``scratch_dir`` already holds a memmap storage and ``existsok`` is False.

    A ``FileExistsError``, and a ``RuntimeError`` as TorchRL raises in that case: ``except
    RuntimeError:`` written for TorchRL keeps working.
    """


class DamagedStorageError(RuntimeError):
    """The files of a memory-mapped storage reopened from its ``scratch_dir`` (``existsok=True``,
    another process, a pickled copy) are not what its layout says: a data file missing or of
    another size, a layout or config file that does not parse, counters past the capacity, or a
    state file that lost them. Raised instead of mapping zeros where committed rows were.
    """


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


def _check_leaf_file(path: Path, shape: torch.Size, dtype: torch.dtype) -> None:
    """:class:`DamagedStorageError` unless ``path`` exists with the size of a ``shape`` /
    ``dtype`` leaf (mapping it would create or zero-extend it: zeros where rows were)."""
    expected = shape.numel() * torch.empty((), dtype=dtype).element_size()
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise DamagedStorageError(f"the data file {str(path)!r} of this memory-mapped storage "
                                  f"is missing (its layout maps {expected} bytes there): its "
                                  "rows are lost.") from None
    if size < expected:
        raise DamagedStorageError(f"the data file {str(path)!r} of this memory-mapped storage "
                                  f"holds {size} bytes, its layout {expected}: it was "
                                  "truncated, and its rows cannot be trusted.")


def _remove_scratch_dir(path: str, owner_pid: int) -> None:
    # only the process that created a temporary scratch dir removes it (forked children
    # inherit the finalizer)
    if os.getpid() == owner_pid:
        shutil.rmtree(path, ignore_errors=True)


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


class LazyMemmapStorage(SharedStateMixin, LazyTensorStorage):
    """A :class:`LazyTensorStorage` whose tensors are memory-mapped files, shared by processes.

    The files are laid out from the first write (keys, shapes and dtypes of that data), one
    file per leaf in ``scratch_dir``. The storage (or a buffer holding it) can be handed to
    worker processes (fork or spawn start methods): what any of them writes, every other one
    reads, and they all continue from the same write cursor and write count. See the module
    docstring for the files and the locking.

    Parameters
    ----------
    max_size : int
        Capacity in slots.
    scratch_dir : str or path-like, optional
        Directory of the memory-mapped files, created if absent. ``None`` creates a temporary
        directory. Anything other than a str or path-like object raises ``TypeError``; ``""``
        raises ``ValueError``; a path naming a file (or below one) ``NotADirectoryError``.
    auto_cleanup : bool, optional
        Remove the scratch directory when the storage is garbage-collected in the process
        that created it, or when that process exits (normally, or on Ctrl+C / SIGINT).
        Defaults to TorchRL's: ``True`` for a temporary directory, ``False`` for a
        ``scratch_dir`` you give (your data is kept). :meth:`cleanup` removes it at once.
    device : str or torch.device
        Where sampled data is sent (the files themselves are on the CPU). ``"cpu"`` by default.
    ndim : int
        Leading dimensions counted in the capacity (see :class:`TensorStorage`).
    existsok : bool
        What to do when ``scratch_dir`` already holds a memmap storage: ``False`` (default)
        raises :class:`ScratchDirInUseError` (a ``FileExistsError`` and, as TorchRL's, a
        ``RuntimeError``); ``True`` opens it and continues with its contents,
        written-row count and cursor (``max_size`` and ``ndim`` must match).
    checkpointer : StorageCheckpointerBase, optional
        Defaults to :class:`TensorStorageCheckpointer`.
    compilable : bool
        Accepted as in TorchRL; no effect (see :class:`~tdreplay.core.Storage`).
    shared_init : bool
        Accepted as in TorchRL; no effect: whichever process writes first lays the files out.

    Notes
    -----
    Samplers keep their own state per process: a :class:`RandomSampler` or a sampler without
    replacement draws from every row written by any process (they read ``len(storage)``), but a
    prioritized sampler only knows the rows written through its own buffer.

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> from tdreplay.core import ReplayBuffer
    >>> rb = ReplayBuffer(storage=LazyMemmapStorage(1000), batch_size=4)
    >>> _ = rb.extend(TensorDict({"obs": torch.randn(10, 3), ("next", "obs"): torch.randn(10, 3)},
    ...                          [10]))
    >>> len(rb), rb.sample()["next", "obs"].shape
    (10, torch.Size([4, 3]))
    >>> sorted(p.name for p in rb.storage.scratch_dir.iterdir() if p.suffix == ".memmap")
    ['obs.memmap']
    """

    #: removes the scratch directory made for this storage when it goes (``None``: none made)
    _finalizer: weakref.finalize | None = None

    #: no entries added: the processes that map this storage would not see a new file
    adds_entries = False
    #: never consolidated: its leaves are files that other processes map
    _consolidates = False

    def __init__(
        self,
        max_size: int,
        *,
        scratch_dir: str | os.PathLike | None = None,
        device: str | torch.device = "cpu",
        ndim: int = 1,
        existsok: bool = False,
        checkpointer: StorageCheckpointerBase | None = None,
        compilable: bool = False,
        auto_cleanup: bool | None = None,
        shared_init: bool = False,
    ) -> None:
        # the flags first: a refused one leaves no scratch directory behind
        existsok = check_flag(existsok, "existsok")
        check_flag(compilable, "compilable")
        check_flag(shared_init, "shared_init")
        auto_cleanup = check_flag(auto_cleanup, "auto_cleanup", allow_none=True)
        super().__init__(max_size, device="cpu", ndim=ndim, checkpointer=checkpointer,
                         compilable=compilable, cleanup_memmap=False)  # (TorchRL's value)
        self._out_device = torch.device(device) if device is not None else torch.device("cpu")
        self.existsok = existsok
        if scratch_dir is not None and not isinstance(scratch_dir, (str, os.PathLike)):
            raise TypeError("scratch_dir must be a str, a path-like object or None, got "
                            f"{scratch_dir!r} ({type(scratch_dir).__name__}).")
        if scratch_dir is not None and os.fspath(scratch_dir) in ("", b""):
            raise ValueError("scratch_dir is empty: give a directory (None for a temporary one).")
        if scratch_dir is None:
            path = Path(tempfile.mkdtemp(prefix="tdreplay-memmap-"))
        else:
            path = Path(scratch_dir).expanduser().resolve()
            if path.exists() and not path.is_dir():
                raise NotADirectoryError(f"scratch_dir {str(path)!r} exists and is not a "
                                         "directory: give a directory (it is created if absent).")
            try:
                path.mkdir(parents=True, exist_ok=True)
            except (FileExistsError, NotADirectoryError) as e:  # a parent is a file
                raise NotADirectoryError(f"scratch_dir {str(path)!r} cannot be created: {e}") \
                    from e
        #: whether the scratch directory goes with the storage (see ``auto_cleanup``)
        self.auto_cleanup = scratch_dir is None if auto_cleanup is None else auto_cleanup
        if self.auto_cleanup:  # at garbage collection or exit, in this process only
            self._finalizer = weakref.finalize(self, _remove_scratch_dir, str(path), os.getpid())
        self._scratch_dir = path
        self._lock_obj = _ProcessLock(str(path / _LOCK_FILE))
        with self._lock_obj:
            self._open_or_create_state(path)
            self._torn = TornWrites(self._state, path / _TORN_FILE)
            # from now on, whoever takes the lock first drops rows a dead writer left torn
            self._lock_obj.watch(self._state.view, self._recover_torn_rows)
            self._recover_torn_rows()
            if self._state.view[_STATE_INIT]:  # laid out: a creation list left is stale
                (path / _CREATING_FILE).unlink(missing_ok=True)

    def _open_or_create_state(self, path: Path) -> None:
        config = {"format": _FORMAT, "max_size": self.max_size, "ndim": self.ndim}
        config_path = path / _CONFIG_FILE
        if config_path.is_file():
            if not self.existsok:
                raise ScratchDirInUseError(
                    f"scratch_dir {str(path)!r} already holds a LazyMemmapStorage: pass "
                    "existsok=True to open it (and continue with its contents), or choose "
                    "another scratch_dir."
                )
            found = _read_json(config_path)
            for name in ("format", "max_size", "ndim"):
                if found.get(name) != config[name]:
                    raise ValueError(
                        f"scratch_dir {str(path)!r} holds a storage with {name}="
                        f"{found.get(name)!r}; this storage was built with {name}={config[name]!r}."
                    )
            self._state = _SharedCounters(str(path / _STATE_FILE))
            if not self._state.array[_STATE_INIT] and (path / _LAYOUT_FILE).is_file() \
                    and not (path / _CREATING_FILE).is_file():
                raise DamagedStorageError(
                    f"scratch_dir {str(path)!r} holds a laid-out storage "
                    f"({_LAYOUT_FILE}) whose state file ({_STATE_FILE}) says nothing was "
                    "written (zeroed or replaced): its row count, cursor and write count are "
                    "lost, and opening it would show an empty buffer over its rows.")
            return
        self._state = _SharedCounters(str(path / _STATE_FILE), create=True)
        tmp = path / f"{_CONFIG_FILE}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(config))
        os.replace(tmp, config_path)

    # ---- shared state -----------------------------------------------------------------------
    @property
    def scratch_dir(self) -> Path:
        """Directory holding the memory-mapped files."""
        return self._scratch_dir

    def cleanup(self) -> bool:
        """Remove the scratch directory and its files now, whatever ``auto_cleanup`` says.

        Returns ``True`` when written data was removed, ``False`` when there was none (never
        written, already cleaned up, or the directory is gone). The storage must not be used
        afterwards; other processes sharing it lose it too.

        Examples
        --------
        >>> s = LazyMemmapStorage(10)
        >>> s.set(slice(0, 2), torch.zeros(2))
        >>> s.cleanup(), s.scratch_dir.exists(), s.cleanup()
        (True, False, False)
        """
        finalizer = self._finalizer
        if finalizer is not None:
            finalizer.detach()
        path = self._scratch_dir
        if not path.is_dir():
            return False
        written = bool(self._state.array[_STATE_INIT])
        shutil.rmtree(path, ignore_errors=True)
        return written

    def _current_layout(self) -> TensorLayout | None:
        layout = self._layout
        if layout is None and self._state.array[_STATE_INIT]:
            layout = self._attach_layout()  # laid out by another process (or before pickling)
        return layout

    @property
    def device(self) -> torch.device:
        return self._out_device

    # ---- layout ----------------------------------------------------------------------------------
    _lays_out_unfilled = False  # leaves are files (zero-filled), shared with other processes
    non_tensor_refusal = ("a LazyMemmapStorage keeps its rows in files that other processes "
                          "map, and non-tensor values held in one process would diverge from "
                          "theirs silently")
    _counts_in_tensor_when_compilable = False  # the count lives in the shared files

    def _allocate(self, shape: torch.Size, dtype: torch.dtype, key: Any = None) -> torch.Tensor:
        filename = self._scratch_dir / _leaf_filename(key, len(self._new_files))
        # recorded (and listed in the creation file) before they exist: a failed first write
        # removes exactly what it created, and so does the next one if this process dies
        self._created.extend(d for d in reversed(filename.parents)
                             if d.is_relative_to(self._scratch_dir) and not d.exists())
        self._created.append(filename)
        self._list_created()
        filename.parent.mkdir(parents=True, exist_ok=True)
        try:
            mmt = MemoryMappedTensor.empty(shape, dtype=dtype, filename=str(filename),
                                           existsok=True)
        except RuntimeError as err:  # torch reports a failed write of the file this way
            if os.strerror(errno.ENOSPC) not in str(err):
                raise
            raise OSError(errno.ENOSPC, f"cannot create {str(filename)!r} (memory-mapped "
                                        f"storage): {os.strerror(errno.ENOSPC)}") from err
        _reserve(filename, mmt.numel() * mmt.element_size())
        self._new_files.append((key, filename.relative_to(self._scratch_dir).as_posix(),
                                dtype, tuple(shape)))
        return mmt.as_subclass(torch.Tensor)

    def _create(self, td: Any, batched: bool, classes: NestedClasses | None = None) -> None:
        with self._lock_obj:
            if self._current_layout() is not None:  # another process laid it out meanwhile
                return
            self._remove_dead_creation()
            self._new_files: list[tuple[Any, str, torch.dtype, tuple[int, ...]]] = []
            self._created: list[Path] = []  # leaf files and directories, in creation order
            try:
                keys = leaf_keys(td)
                taken = [self._scratch_dir / _leaf_filename(k, i) for i, k in enumerate(keys)]
                existing = [str(p) for p in taken if p.exists()]
                if existing:
                    raise FileExistsError(
                        f"scratch_dir already holds files the storage would write: {existing[:3]}"
                        " (choose an empty scratch_dir)."
                    )
                super()._create(td, batched, classes)
                self._write_layout()
            except BaseException:
                self._remove_created()
                self._layout = None
                raise
            finally:
                del self._new_files, self._created
            self._state.array[_STATE_INIT] = 1
            (self._scratch_dir / _CREATING_FILE).unlink(missing_ok=True)

    def _list_created(self) -> None:
        """Write ``self._created`` to the creation file (atomically: whole, or as before)."""
        scratch = self._scratch_dir
        listed = {"pid": os.getpid(),
                  "created": [p.relative_to(scratch).as_posix() for p in self._created]}
        tmp = scratch / f"{_CREATING_FILE}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(listed))
        os.replace(tmp, scratch / _CREATING_FILE)

    def _remove_created(self) -> None:
        """Remove what a failed first write created (files, then directories deepest first,
        a temporary layout file and the creation file): a retry finds ``scratch_dir`` as it
        was."""
        scratch = self._scratch_dir
        pid = os.getpid()
        for name in (f"{_LAYOUT_FILE}.{pid}.tmp", f"{_CREATING_FILE}.{pid}.tmp"):
            (scratch / name).unlink(missing_ok=True)
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
        tmp = self._scratch_dir / f"{_LAYOUT_FILE}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(layout))
        os.replace(tmp, self._scratch_dir / _LAYOUT_FILE)

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
                                             nested), self.ndim, self._device, classes)
        return self._layout

    # ---- reads and writes under the process lock -------------------------------------------
    def _recover_torn_rows(self) -> int:
        """Drop the rows a writer that died was overwriting (under the lock); how many."""
        torn = self._torn
        return torn.recover(self._current_layout()) if torn.pending else 0

    def set(self, cursor: int | slice | torch.Tensor | Sequence[int], data: Any, *,
            set_cursor: bool = True) -> None:
        if set_cursor is not True and set_cursor is not False:  # (one check when a bool)
            check_flag(set_cursor, "set_cursor")
        # (taking the lock dropped any torn rows: _ProcessLock.watch)
        with self._lock_obj:
            state = self._state.view
            if state[_STATE_TORN]:  # the hold's last write or edits: complete, counters moved
                self._torn.settle_hold()
            if not set_cursor and self._set_in_place(cursor, data):
                return
            if type(cursor) is slice and cursor.step is None:  # what round-robin writers pass
                start, stop, layout = cursor.start, cursor.stop, self._layout
                if start is not None and stop is not None and 0 <= start < stop and (
                        start >= state[_STATE_LEN]
                        or (layout is not None and stop <= layout.rows < PACKED_ROWS)):
                    # a first write past the count (counted once copied) or an overwrite of
                    # counted rows: recorded until the hold ends (the writer's counters move
                    # after this returns: see _torn_writes)
                    self._torn.record_rows(start, stop)
                    self._write_recorded(cursor, data, set_cursor)
                    return
            self._set_over_counted(cursor, data, set_cursor)

    def _write_recorded(self, rows: Any, data: Any, set_cursor: bool) -> None:
        """Write rows recorded as under way; their record is cleared as the hold ends."""
        try:
            super().set(rows, data, set_cursor=set_cursor)
        except BaseException as err:
            self._torn.failed(err, self._layout)
            raise
        self._lock_obj.before_unlock = self._torn.settle_hold

    def _set_in_place(self, rows: Any, data: Any) -> bool:
        """``storage[i] = x`` / ``rb[i] = x`` (``set`` with ``set_cursor=False``) of rows that
        are all counted: journaled as an edit of every entry of those rows, so a process that
        dies in the middle leaves them as before (none dropped: they were committed). ``False``
        (nothing done) for rows not all counted, left to the write paths."""
        layout, written = self._layout, self._rows_written()
        if layout is None or not written:
            return False
        flat = as_long_tensor(rows, name="index").reshape(-1) if not isinstance(rows, slice) \
            else torch.arange(*rows.indices(layout.rows))
        if not flat.numel() or int(flat.min()) < 0 or int(flat.max()) >= written:
            return False
        with self._edit_guard() as guard:
            guard.record(layout.td, layout.keys, rows, written)
            super().set(rows, data, set_cursor=False)
        return True

    def _set_over_counted(self, rows: int | slice | torch.Tensor | Sequence[int],
                          data: Any, set_cursor: bool) -> None:
        """``set`` of rows that may be counted already: recorded while they are overwritten
        (until the hold ends)."""
        torn = self._torn
        written = self._rows_written()
        layout = self._current_layout() if written else None
        if layout is None or not torn.begin(rows, written, layout.rows):
            super().set(rows, data, set_cursor=set_cursor)
            return
        self._write_recorded(rows, data, set_cursor)

    def empty(self) -> None:
        """Forget the written rows (the count to 0): journaled as a load of no rows (the old
        count, cursor and write count; see ``_shared_edits``), so that a buffer's ``loads`` of
        an empty checkpoint whose process dies leaves the storage as it was."""
        with self._edit_guard() as guard:
            guard.overwrite(self._current_layout(), 0, self._rows_written())
            super().empty()

    def get(self, index: int | torch.Tensor) -> Any:
        with self._lock_obj:
            out = super().get(index)
        if self._out_device.type != "cpu":
            out = out.to(self._out_device)
        return out

    def get_trusted(self, index: torch.Tensor) -> Any:
        """:meth:`TensorStorage.get_trusted`; while counted rows are being overwritten by
        another process, or were left torn by one that died (the slots may have been drawn
        before), :meth:`get`: under the lock, after them, with the slots checked.

        Examples
        --------
        >>> s = LazyMemmapStorage(10)
        >>> s.set(slice(0, 4), torch.arange(4) * 10)
        >>> s.get_trusted(torch.tensor([3, 0])).tolist()
        [30, 0]
        """
        layout = self._current_layout()
        if (self._state.view[_STATE_TORN] and not self._lock_obj.held) or layout is None \
                or type(index) is not torch.Tensor or index.dtype is not torch.long:
            return self.get(index)
        return self._format.from_td(layout.gather(index))  # (TensorStorage's, inlined)

    def __getitem__(self, index: Any) -> Any:
        with self._lock_obj:
            out = super().__getitem__(index)
        return out if self._out_device.type == "cpu" else out.to(self._out_device)

    def rows_capacity_for(self, data: Any, batched: bool) -> int:
        with self._lock_obj:
            return super().rows_capacity_for(data, batched)

    # ---- copies ----------------------------------------------------------------------------------
    def __deepcopy__(self, memo: dict[int, Any]) -> LazyMemmapStorage:
        """An independent storage with a copy of the data, in a temporary scratch directory
        of its own (removed with the copy): ``copy.deepcopy`` copies, as TorchRL's does,
        where pickling (what another process receives) maps the same files.

        Examples
        --------
        >>> import copy
        >>> s = LazyMemmapStorage(10)
        >>> s.set(torch.arange(3), torch.arange(3.0))
        >>> c = copy.deepcopy(s)
        >>> c.set(torch.arange(3, 5), torch.ones(2))
        >>> len(s), len(c), c.scratch_dir != s.scratch_dir
        (3, 5, True)
        """
        copied = self.empty_copy(copy.deepcopy(self.checkpointer, memo))
        memo[id(self)] = copied
        if self.initialized:
            copied.load_state_dict(self.state_dict())
        # the writers' cursor and write count live in the storage's shared memory
        copied.shared_writer_counters()[:] = self.shared_writer_counters()
        return copied

    def empty_copy(self, checkpointer: StorageCheckpointerBase[Any]) -> LazyMemmapStorage:
        """A storage built as this one (capacity, ``ndim``, device), empty, in a temporary
        scratch directory of its own."""
        return LazyMemmapStorage(self.max_size, device=self._out_device, ndim=self.ndim,
                                 checkpointer=checkpointer)

    # ---- pickling: map the same files in the receiving process -----------------------------------
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_finalizer", None)
        state["_layout"] = None  # the receiving process maps the files again
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock_obj.watch(self._state.view, self._recover_torn_rows)  # (a new lock object)

    def __repr__(self) -> str:
        shape = None if self.shape is None else tuple(self.shape)
        return (f"{type(self).__name__}(max_size={self.max_size}, ndim={self.ndim}, shape={shape}, "
                f"len={len(self)}, scratch_dir={str(self._scratch_dir)!r}, "
                f"device={self._out_device})")
