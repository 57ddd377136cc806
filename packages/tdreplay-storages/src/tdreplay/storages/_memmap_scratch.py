"""The scratch directory of a ``LazyMemmapStorage``: opened or made, and removed.

A storage built over a directory that holds none writes its config file (``max_size`` and
``ndim``) and state file there; one built over a directory that holds a storage opens it
(``existsok=True``: the config must match, the state file must be whole) or raises
:class:`ScratchDirInUseError`. :meth:`ScratchDirMixin.cleanup` removes the storage's files at
once; with ``auto_cleanup`` they go with the storage (``_remove_scratch_dir``, its finalizer).
Only what the storage created is removed (:func:`_remove_own_files`): its own files, the leaf
files its layout (or the creation list of a first write under way) names and their
directories when empty, then ``scratch_dir`` when empty; a user's files stay. A temporary
directory the storage made itself goes whole.
"""

from __future__ import annotations

import json
import os
import shutil
import weakref
from pathlib import Path
from typing import Any

from tdreplay.core.atomic_files import replace_file

from ._memmap_files import (
    _CONFIG_FILE,
    _CREATING_FILE,
    _FORMAT,
    _LAYOUT_FILE,
    _LOCK_FILE,
    _RESERVED,
    _inside,
    _read_json,
    _remove_paths,
)
from ._memmap_shared import _STATE_FILE, _STATE_INIT, _SharedCounters
from ._storage_errors import DamagedStorageError


class ScratchDirInUseError(FileExistsError, RuntimeError):
    """``scratch_dir`` already holds a memmap storage and ``existsok`` is False.

    A ``FileExistsError``, and a ``RuntimeError`` as TorchRL raises in that case: ``except
    RuntimeError:`` written for TorchRL keeps working.
    """

    __module__ = "tdreplay.storages.memmap_storage"  # where it is imported from (and named)


def _listed_files(listing: Path, key: str) -> list[str]:
    """The relative paths a layout file (``key="leaves"``) or a creation list
    (``key="created"``) names; none when it is missing or cannot be read."""
    try:
        found: Any = json.loads(listing.read_text())[key]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    if not isinstance(found, list):
        return []
    if key == "leaves":
        found = [leaf.get("file") if isinstance(leaf, dict) else None for leaf in found]
    return [rel for rel in found if isinstance(rel, str) and rel]


def _own_paths(path: Path) -> list[Path]:
    """What a memmap storage created in its scratch directory ``path``, in the order to remove
    it: the leaf files its layout names (and those a first write under way, or killed, listed
    in its creation list), their directories deepest first (removed only when empty), the
    temporary files of its atomic replacements, then its own files, the lock last."""
    leaves = [path / rel for rel in (*_listed_files(path / _LAYOUT_FILE, "leaves"),
                                     *_listed_files(path / _CREATING_FILE, "created"))]
    leaves = list(dict.fromkeys(p for p in leaves if _inside(p, path) and p != path))
    dirs = {d for leaf in leaves for d in leaf.parents if d != path and _inside(d, path)}
    temporaries = [tmp for name in sorted(_RESERVED) for tmp in path.glob(f".{name}.*.tmp")]
    own = [path / name for name in sorted(_RESERVED - {_LAYOUT_FILE, _CREATING_FILE,
                                                        _LOCK_FILE})]
    # the lists of leaves go after the leaves: a cleanup interrupted can be told what is left
    return [*(p for p in leaves if p not in dirs),
            *sorted(dirs, key=lambda d: len(d.parts), reverse=True),
            *temporaries, *own, path / _CREATING_FILE, path / _LAYOUT_FILE, path / _LOCK_FILE]


def _remove_own_files(path: Path, made_dir: bool) -> None:
    """Remove what a memmap storage created in ``path`` (:func:`_own_paths`), then ``path``
    itself when that leaves it empty; a temporary directory the storage made (``made_dir``)
    goes whole. A file the storage did not create (a user's ``notes.txt``, a file of the name
    of a leaf that its first write refused to overwrite) stays, and so does its directory."""
    if made_dir:
        shutil.rmtree(path, ignore_errors=True)
        return
    if not path.is_dir() or path.is_symlink():
        return
    _remove_paths(_own_paths(path))
    try:
        path.rmdir()
    except OSError:
        pass  # not empty: files of someone else's are left with it


def _remove_scratch_dir(path: str, owner_pid: int, made_dir: bool = True) -> None:
    # only the process that created the storage removes its files (forked children inherit
    # the finalizer); what the storage did not create stays (_remove_own_files)
    if os.getpid() == owner_pid:
        _remove_own_files(Path(path), made_dir)


class ScratchDirMixin:
    """Opening (or making) and removing the scratch directory of a memory-mapped storage
    (mixed into :class:`~tdreplay.storages.LazyMemmapStorage`)."""

    # the storage's attributes read here (annotations only: a class default would slow down
    # every attribute read of the storage, see tdreplay.core.buffer_parts)
    _scratch_dir: Path
    _state: _SharedCounters
    _finalizer: weakref.finalize | None
    _made_scratch_dir: bool  # a temporary directory made for the storage (removed whole)
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
                if name not in found:
                    raise DamagedStorageError(
                        f"scratch_dir {str(path)!r}: its {_CONFIG_FILE} has no {name!r} (the "
                        "file is damaged). Nothing was changed; put the file back (or remove "
                        "the directory to start afresh).")
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
        """Remove the storage's files now, whatever ``auto_cleanup`` says.

        Only what the storage created goes: its data files (one per leaf, and the directories
        of nested keys when they are left empty), its state, config, lock and journal files,
        then ``scratch_dir`` itself when that leaves it empty. Files the storage did not create
        stay, with the directory (unlike TorchRL, which removes the whole directory): a
        user's ``notes.txt``, or an ``obs.memmap`` of the user's that the first write refused
        to overwrite. A temporary directory the storage made (no ``scratch_dir`` given) is
        removed whole.

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

        A directory of your own keeps your files:

        >>> import os, tempfile
        >>> mine = tempfile.mkdtemp()
        >>> _ = open(os.path.join(mine, "notes.txt"), "w").write("keep")
        >>> s = LazyMemmapStorage(10, scratch_dir=mine)
        >>> s.set(slice(0, 2), torch.zeros(2))
        >>> s.cleanup(), os.listdir(mine)
        (True, ['notes.txt'])
        >>> import shutil; shutil.rmtree(mine)
        """
        finalizer = self._finalizer
        if finalizer is not None:
            finalizer.detach()
        path = self._scratch_dir
        if not path.is_dir():
            return False
        # (a directory that stays, with a user's files, holds no layout once cleaned up)
        written = bool(self._state.array[_STATE_INIT]) and (path / _LAYOUT_FILE).is_file()
        _remove_own_files(path, getattr(self, "_made_scratch_dir", False))
        return written
