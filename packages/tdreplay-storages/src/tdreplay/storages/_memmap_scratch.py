"""The scratch directory of a ``LazyMemmapStorage``: opened or made, and removed.

A storage built over a directory that holds none writes its config file (``max_size`` and
``ndim``) and state file there; one built over a directory that holds a storage opens it
(``existsok=True``: the config must match, the state file must be whole) or raises
:class:`ScratchDirInUseError`. :meth:`ScratchDirMixin.cleanup` removes the directory at once;
a temporary directory goes with its storage (``_remove_scratch_dir``, its finalizer).
"""

from __future__ import annotations

import json
import os
import shutil
import weakref
from pathlib import Path

from tdreplay.core.atomic_files import replace_file

from ._memmap_files import (
    _CONFIG_FILE,
    _CREATING_FILE,
    _FORMAT,
    _LAYOUT_FILE,
    _read_json,
)
from ._memmap_shared import _STATE_FILE, _STATE_INIT, _SharedCounters
from ._storage_errors import DamagedStorageError


class ScratchDirInUseError(FileExistsError, RuntimeError):
    """``scratch_dir`` already holds a memmap storage and ``existsok`` is False.

    A ``FileExistsError``, and a ``RuntimeError`` as TorchRL raises in that case: ``except
    RuntimeError:`` written for TorchRL keeps working.
    """

    __module__ = "tdreplay.storages.memmap_storage"  # where it is imported from (and named)


def _remove_scratch_dir(path: str, owner_pid: int) -> None:
    # only the process that created a temporary scratch dir removes it (forked children
    # inherit the finalizer)
    if os.getpid() == owner_pid:
        shutil.rmtree(path, ignore_errors=True)


class ScratchDirMixin:
    """Opening (or making) and removing the scratch directory of a memory-mapped storage
    (mixed into :class:`~tdreplay.storages.LazyMemmapStorage`)."""

    # the storage's attributes read here (annotations only: a class default would slow down
    # every attribute read of the storage, see tdreplay.core.buffer_parts)
    _scratch_dir: Path
    _state: _SharedCounters
    _finalizer: weakref.finalize | None
    existsok: bool
    max_size: int
    ndim: int

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
            state_path = path / _STATE_FILE
            if not state_path.is_file():
                if (path / _LAYOUT_FILE).is_file():
                    raise DamagedStorageError(
                        f"scratch_dir {str(path)!r} holds a laid-out storage ({_LAYOUT_FILE}) "
                        f"but no state file ({_STATE_FILE}): its row count, cursor and write "
                        "count are lost. Nothing was changed; put the file back (or remove the "
                        "directory to start afresh).")
                # (nothing laid out: no row was written, and the counters start at zero)
                self._state = _SharedCounters(str(state_path), create=True)
                return
            self._state = _SharedCounters(str(state_path))
            if not self._state.array[_STATE_INIT] and (path / _LAYOUT_FILE).is_file() \
                    and not (path / _CREATING_FILE).is_file():
                raise DamagedStorageError(
                    f"scratch_dir {str(path)!r} holds a laid-out storage "
                    f"({_LAYOUT_FILE}) whose state file ({_STATE_FILE}) says nothing was "
                    "written (zeroed or replaced): its row count, cursor and write count are "
                    "lost, and opening it would show an empty buffer over its rows.")
            return
        if (path / _LAYOUT_FILE).is_file():  # (a storage is created config first, layout last)
            raise DamagedStorageError(
                f"scratch_dir {str(path)!r} holds a laid-out storage ({_LAYOUT_FILE}) but no "
                f"{_CONFIG_FILE}: its configuration file is missing. Nothing was changed; put "
                f"the file back (or remove the directory to start afresh).")
        self._state = _SharedCounters(str(path / _STATE_FILE), create=True)
        replace_file(config_path, json.dumps(config).encode(), durable=False)

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
        >>> import torch
        >>> from tdreplay.storages import LazyMemmapStorage
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
