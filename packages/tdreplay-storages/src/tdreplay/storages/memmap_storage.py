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
import os
import tempfile
import weakref
from pathlib import Path
from typing import Any

import torch
from tensordict import MemoryMappedTensor

from tdreplay.core import StorageCheckpointerBase
from tdreplay.core.file_room import reserve_file, torch_file_error
from tdreplay.core.utils import check_flag

from ._layout import leaf_keys
from ._memmap_files import _CREATING_FILE, _LOCK_FILE, _TORN_FILE, MemmapFilesMixin, _leaf_filename
from ._memmap_rows import MemmapRowsMixin
from ._memmap_scratch import ScratchDirInUseError as ScratchDirInUseError  # (re-exported)
from ._memmap_scratch import ScratchDirMixin, _remove_scratch_dir
from ._memmap_shared import _STATE_INIT, _ProcessLock
from ._storage_errors import DamagedStorageError as DamagedStorageError  # (re-exported)
from ._tensorclasses import NestedClasses
from ._torn_writes import TornWrites
from .tensor_storage import LazyTensorStorage

#: (a module-level name: the killed-first-write tests wrap it)
_reserve = reserve_file



class LazyMemmapStorage(MemmapRowsMixin, ScratchDirMixin, MemmapFilesMixin, LazyTensorStorage):
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
    scratch_dir : str, path-like or tempfile.TemporaryDirectory, optional
        Directory of the memory-mapped files, created if absent. ``None`` creates a temporary
        directory; a ``tempfile.TemporaryDirectory`` is its directory (removed when that
        object is cleaned up: keep it as long as the storage). Anything else than these raises
        ``TypeError``; ``""`` raises ``ValueError``; a path naming a file (or below one)
        ``NotADirectoryError``.
    auto_cleanup : bool, optional
        Remove the storage's files when the storage is garbage-collected in the process
        that created it, or when that process exits (normally, or on Ctrl+C / SIGINT): only
        the files it created, and ``scratch_dir`` when that leaves it empty (see
        :meth:`cleanup`; a temporary directory it made goes whole). Defaults to TorchRL's:
        ``True`` for a temporary directory, ``False`` for a ``scratch_dir`` you give (your
        data is kept). :meth:`cleanup` removes them at once.
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
        if isinstance(scratch_dir, tempfile.TemporaryDirectory):  # (as TorchRL's tutorial)
            scratch_dir = scratch_dir.name
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
        #: a temporary directory made for this storage: removed whole (a directory given
        #: keeps what the storage did not create, see ``cleanup``)
        self._made_scratch_dir = scratch_dir is None
        if self.auto_cleanup:  # at garbage collection or exit, in this process only
            self._finalizer = weakref.finalize(self, _remove_scratch_dir, str(path), os.getpid(),
                                               self._made_scratch_dir)
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
            # no room: a full disk (ENOSPC), a file-size limit or FAT32's 4 GiB (EFBIG)
            named = torch_file_error(err, "creating a file of a memory-mapped storage")
            if named is not None:
                raise OSError(named.errno, named.strerror, str(filename)) from err
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
        if self.slot_generations is not None:  # (the rows' write generations, when tracked)
            copied.slot_generations = copy.deepcopy(self.slot_generations, memo)
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
