"""Crash-safe checkpoint directories.

A checkpoint written at ``path`` is laid out as::

    path/
      tdreplay-checkpoint.json      # pointer: format version, current snapshot, owned snapshots
      .tdreplay-checkpoint.lock     # advisory lock serialising writers (and readers vs writers)
      snapshot-<n>-<uuid>/          # one complete snapshot
        manifest.json               # size and CRC-32 of every file of the snapshot
        ...                         # whatever the components wrote

A new snapshot is written completely (files flushed and fsynced, manifest last; a component
that fsyncs a file and computes its CRC while writing it says so with
:func:`record_written_file`, sparing a second pass over it) *beside* the
current one, then the pointer file is replaced atomically with :func:`os.replace`, and only
then are older snapshots removed. A process killed at any moment therefore leaves either the
previous checkpoint or the new one loadable, never a half-written one: the pointer only ever
names a complete snapshot. :func:`open_checkpoint` checks the pointer's and the manifest's
checksums, the format version and every file's size and CRC before returning, so a
truncated or corrupted checkpoint is refused, naming the damaged file, before a buffer changes.

The format owns exactly what it writes. The pointer records (under ``"snapshots"``) every
snapshot directory it created that may still exist, *before* the directory is created; a
save removes only recorded snapshots (older ones, and those of saves that crashed), never
another entry of the directory, whatever its name. Writers hold an exclusive
:func:`fcntl.flock` on the lock file for the whole save, so saves of several processes or
threads to one path run one after the other and the last one committed is what loads;
readers hold a shared lock, so a save never removes a snapshot while it is being read.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import uuid
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from .atomic_files import fsync_path as _fsync_path  # (patched by tests as checkpoint._fsync_path)

FORMAT_VERSION = 1
POINTER_NAME = "tdreplay-checkpoint.json"
MANIFEST_NAME = "manifest.json"
LOCK_NAME = ".tdreplay-checkpoint.lock"
SNAPSHOT_PREFIX = "snapshot-"
_TMP_POINTER_NAME = f".{POINTER_NAME}.tmp"
_CHUNK = 1 << 22


class CheckpointError(RuntimeError):
    """Raised when a checkpoint is missing, corrupted, of another format, or does not match."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """A checkpoint path, or a file a checkpoint needs, does not exist.

    Also a ``FileNotFoundError``, as TorchRL raises for a missing path: ``except
    FileNotFoundError:`` written for TorchRL keeps working, and ``except CheckpointError:``
    catches it with every other damaged checkpoint.

    Examples
    --------
    >>> try:
    ...     read_json(Path("/no/such/dir/storage.json"))
    ... except FileNotFoundError as err:
    ...     print(type(err).__name__, isinstance(err, CheckpointError))
    CheckpointNotFoundError True
    """


def _crc32(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


#: files of the snapshot being written (in this thread / context) whose writer fsynced them and
#: computed their CRC-32 while writing: ``{path: (size, crc32, mtime_ns, inode)}``
_RECORDED: ContextVar[dict[str, tuple[int, int, int, int]] | None] = ContextVar(
    "tdreplay_checkpoint_recorded", default=None)


#: the snapshot directories :func:`write_checkpoint` is writing in this thread / context
_WRITING: ContextVar[tuple[Path, ...]] = ContextVar("tdreplay_checkpoint_writing", default=())


def inside_checkpoint_snapshot(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` lies in a snapshot directory that :func:`write_checkpoint` is writing
    in this thread (or context): a component's ``dumps`` given such a path (a buffer's
    ``dumps`` gives its storage ``snapshot / "storage"``) writes its files plainly there,
    since the enclosing snapshot is committed atomically as a whole; given another path, it
    writes a checkpoint of its own with :func:`write_checkpoint` (snapshots never nest).

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     with write_checkpoint(d) as snap:
    ...         print(inside_checkpoint_snapshot(snap / "storage"), inside_checkpoint_snapshot(d))
    ...     print(inside_checkpoint_snapshot(snap / "storage"))
    True False
    False
    """
    target = Path(os.path.abspath(path))
    return any(target == snap or snap in target.parents for snap in _WRITING.get())


def holds_checkpoint(path: str | os.PathLike[str]) -> bool:
    """Whether the directory ``path`` holds a committed checkpoint of this format (its pointer
    names a snapshot, or is damaged: :func:`open_checkpoint` then says so), rather than files
    written plainly into it (a storage's checkpoint written before storages saved atomically;
    such files stay what loads while the first save of this format to ``path`` has not
    committed).

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     before = holds_checkpoint(d)
    ...     with write_checkpoint(d) as snap:
    ...         _ = (snap / "a.txt").write_text("a")
    ...     print(before, holds_checkpoint(d))
    False True
    """
    return _pointer_state(path) in ("committed", "damaged")  # (open_checkpoint names damage)


def _pointer_state(path: str | os.PathLike[str]) -> str:
    """``"absent"``, ``"damaged"``, ``"committed"`` (it names a snapshot) or ``"unfinished"``
    (it names none: the first save has not committed): the pointer of ``path``."""
    if not (Path(path) / POINTER_NAME).is_file():
        return "absent"
    try:
        snapshot = _read_pointer(Path(path)).get("snapshot")
    except CheckpointError:
        return "damaged"
    return "unfinished" if snapshot is None else "committed"


def holds_checkpoint_files(path: str | os.PathLike[str]) -> bool:
    """Whether the directory ``path`` holds files of this format: its pointer or a snapshot
    directory, committed or not (:func:`open_checkpoint` refuses a first save that did not
    finish, saying so).

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     before = holds_checkpoint_files(d)
    ...     (Path(d) / "snapshot-000000-0123456789ab").mkdir()
    ...     print(before, holds_checkpoint_files(d), holds_checkpoint(d))
    False True False
    """
    root = Path(path)
    if not root.is_dir():
        return False
    return (root / POINTER_NAME).is_file() or any(
        _is_snapshot_name(entry.name) and entry.is_dir() for entry in root.iterdir())


def first_save_unfinished(path: str | os.PathLike[str]) -> bool:
    """Whether the directory ``path`` holds the pointer of a checkpoint whose first save has
    not committed (it names no snapshot): files written plainly into ``path`` before (a
    storage's checkpoint of an earlier version) are then still what loads. A save writes its
    pointer before its snapshot directory, so snapshot directories without a pointer mean a
    lost pointer, not an unfinished save.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     try:
    ...         with write_checkpoint(d) as snap:
    ...             raise OSError("disk full")
    ...     except OSError:
    ...         pass
    ...     unfinished = first_save_unfinished(d)
    ...     with write_checkpoint(d) as snap:
    ...         _ = (snap / "a.txt").write_text("a")
    ...     print(unfinished, first_save_unfinished(d))
    True False
    """
    return _pointer_state(path) == "unfinished"


def record_written_file(path: str | os.PathLike[str], crc32: int) -> bool:
    """Tell the checkpoint being written that ``path`` is complete: its writer fsynced it and
    computed ``crc32``, the CRC-32 of every byte it wrote (``zlib.crc32`` carried over the
    writes, in file order).

    :func:`write_checkpoint` then takes the CRC as given instead of fsyncing the file again
    and reading it back, as long as the file still has the size, modification time and inode
    it had here (a file changed since is fsynced and read back as any other). Loading checks
    every file against its CRC as always. Returns ``False`` (and records nothing) outside a
    :func:`write_checkpoint` block.

    Examples
    --------
    >>> import tempfile, pathlib, zlib
    >>> with tempfile.TemporaryDirectory() as d:
    ...     with write_checkpoint(d) as snap:
    ...         data = b"hello"
    ...         with open(snap / "a.bin", "wb") as f:
    ...             _ = f.write(data)
    ...             f.flush()
    ...             os.fsync(f.fileno())
    ...         recorded = record_written_file(snap / "a.bin", zlib.crc32(data))
    ...     print(recorded, (verify_checkpoint(d) / "a.bin").read_bytes())
    True b'hello'
    >>> record_written_file("elsewhere.bin", 0)
    False
    """
    recorded = _RECORDED.get()
    if recorded is None:
        return False
    st = os.stat(path)
    recorded[os.path.abspath(path)] = (st.st_size, int(crc32), st.st_mtime_ns, st.st_ino)
    return True


def _size_and_crc(file: Path, recorded: dict[str, tuple[int, int, int, int]]) -> tuple[int, int]:
    """``(size, crc32)`` of a snapshot file, fsynced: as its writer recorded it when the file
    is unchanged since, else fsynced and read back here."""
    st = file.stat()
    known = recorded.get(os.path.abspath(file))
    if known is not None and known[0] == st.st_size and known[2:] == (st.st_mtime_ns,
                                                                        st.st_ino):
        return st.st_size, known[1]
    _fsync_path(file)
    return file.stat().st_size, _crc32(file)


def _snapshot_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST_NAME)


@contextmanager
def _locked(root: Path, *, shared: bool) -> Iterator[None]:
    """Hold an advisory ``flock`` on ``root/LOCK_NAME`` (shared or exclusive).

    The lock is released when the file is closed, including when the process dies, so a
    killed writer never leaves the checkpoint locked. Readers that cannot create the lock file
    (a read-only directory) read without it; platforms without ``fcntl`` run unlocked.
    """
    if sys.platform == "win32":  # pragma: no cover - no flock there
        yield
        return
    import fcntl

    lock_path = root / LOCK_NAME
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError:
        if not shared:
            raise
        try:
            fd = os.open(lock_path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            yield  # nothing to lock on: a read-only directory no writer can change either
            return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _pointer_body_crc(body: dict[str, Any]) -> int:
    return zlib.crc32(json.dumps(body, sort_keys=True).encode())


def _write_pointer(root: Path, snapshot: str | None, manifest_crc32: int | None,
                   snapshots: list[str]) -> None:
    """Replace the pointer atomically, then fsync ``root`` (the rename made durable)."""
    _replace_pointer(root, snapshot, manifest_crc32, snapshots)
    _fsync_path(root)


def _replace_pointer(root: Path, snapshot: str | None, manifest_crc32: int | None,
                     snapshots: list[str]) -> None:
    """Replace the pointer atomically (temporary file, fsync, rename): once this returns,
    the pointer on disk is the new one.

    The temporary file has one fixed name: writers hold the exclusive lock, so one writes it
    at a time, and what a killed writer left is overwritten by the next one.
    """
    body: dict[str, Any] = {"format_version": FORMAT_VERSION, "snapshot": snapshot,
                            "manifest_crc32": manifest_crc32, "snapshots": snapshots}
    body["crc32"] = _pointer_body_crc(body)
    tmp = root / _TMP_POINTER_NAME
    try:
        try:
            with open(tmp, "w") as f:
                f.write(json.dumps(body))
                f.flush()
                os.fsync(f.fileno())
        except OSError as err:
            raise named_write_error(err, tmp) from err
        os.replace(tmp, root / POINTER_NAME)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _is_snapshot_name(name: object) -> bool:
    """A name this format gives snapshots: ``snapshot-<n>-<hex>``, a plain directory name."""
    if not isinstance(name, str) or not name.startswith(SNAPSHOT_PREFIX):
        return False
    parts = name[len(SNAPSHOT_PREFIX):].split("-")
    return (len(parts) == 2 and parts[0].isdigit() and bool(parts[1])
            and all(c in "0123456789abcdef" for c in parts[1]))


def _read_pointer(path: Path) -> dict[str, Any]:
    """The pointer of the checkpoint at ``path``, checked; ``CheckpointError`` naming it."""
    pointer = path / POINTER_NAME
    if not path.exists():
        raise CheckpointNotFoundError(f"no checkpoint at {str(path)!r}: the path does not exist.")
    if not pointer.is_file():
        raise CheckpointNotFoundError(
            f"no tdreplay checkpoint at {str(path)!r}: {POINTER_NAME} is missing "
            "(was it written with ReplayBuffer.dumps?)."
        )
    try:
        meta = json.loads(pointer.read_bytes().decode())
    except (OSError, ValueError) as err:
        raise CheckpointError(f"checkpoint pointer {str(pointer)!r} is unreadable: {err}") from err
    if not isinstance(meta, dict):
        raise CheckpointError(f"checkpoint pointer {str(pointer)!r} does not hold a JSON object.")
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint pointer {str(pointer)!r} has format version {version!r}; this tdreplay "
            f"reads format version {FORMAT_VERSION}."
        )
    if "snapshots" in meta or "crc32" in meta:
        # written by this version: the pointer checks itself (a pointer without these keys
        # was written before they existed and is read as it was)
        body = {k: v for k, v in meta.items() if k != "crc32"}
        snapshots = meta.get("snapshots")
        if (meta.get("crc32") != _pointer_body_crc(body) or not isinstance(snapshots, list)
                or not all(_is_snapshot_name(s) for s in snapshots)):
            raise CheckpointError(f"checkpoint pointer {str(pointer)!r} is corrupted "
                                  "(checksum mismatch).")
    snapshot = meta.get("snapshot")
    if snapshot is not None and not _is_snapshot_name(snapshot):
        raise CheckpointError(f"checkpoint pointer {str(pointer)!r} is corrupted: it names "
                              f"{snapshot!r}, not a snapshot directory.")
    return meta


def _owned_snapshots(root: Path) -> tuple[str | None, int | None, list[str]]:
    """(current snapshot, its manifest's CRC-32, snapshots this format created that may still
    exist) at ``root``.

    A pointer that cannot be read proves nothing: then no snapshot is owned, and nothing of
    the directory will be removed.
    """
    if not (root / POINTER_NAME).is_file():
        return None, None, []
    try:
        meta = _read_pointer(root)
    except CheckpointError:
        return None, None, []
    current = meta.get("snapshot")
    crc = meta.get("manifest_crc32")
    recorded = meta.get("snapshots")
    owned = list(recorded) if isinstance(recorded, list) else []
    if current is not None and current not in owned:
        owned.append(current)  # a pointer of an older writer records only its snapshot
    return current, crc if isinstance(crc, int) else None, owned


def _new_snapshot_name(root: Path, current: str | None, owned: list[str]) -> str:
    counter = 0
    for name in [current, *owned]:
        if name is not None:
            counter = max(counter, int(name[len(SNAPSHOT_PREFIX):].split("-")[0]) + 1)
    while True:
        name = f"{SNAPSHOT_PREFIX}{counter:06d}-{uuid.uuid4().hex[:12]}"
        if not os.path.lexists(root / name) and name not in owned:
            return name


def _remove_snapshot(root: Path, name: str) -> None:
    entry = root / name
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry, ignore_errors=True)


@contextmanager
def write_checkpoint(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Context manager giving a fresh snapshot directory; commits it atomically on exit.

    The directory ``path`` is created if needed; entries in it that this format did not
    create are left alone. Concurrent saves to one ``path`` (threads or processes) take
    turns on an advisory lock; each commits a complete snapshot, and the last one committed
    is what loads. An exception inside the block (a full disk, a failing component) removes
    the new snapshot and keeps the previous checkpoint.

    Parameters
    ----------
    path : str or os.PathLike
        The checkpoint directory.

    Yields
    ------
    pathlib.Path
        The empty snapshot directory to write into.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> with tempfile.TemporaryDirectory() as d:
    ...     _ = (pathlib.Path(d) / "snapshot-000001-mine").mkdir()   # not the format's
    ...     with write_checkpoint(d) as snap:
    ...         _ = (snap / "hello.txt").write_text("hi")
    ...     with open_checkpoint(d) as snap:
    ...         print((snap / "hello.txt").read_text())
    ...     print((pathlib.Path(d) / "snapshot-000001-mine").is_dir())
    hi
    True
    """
    root = Path(path)
    if root.exists() and not root.is_dir():
        raise FileExistsError(f"checkpoint path {str(root)!r} is a file: a checkpoint is a "
                              "directory (give the path of a directory, new or existing).")
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root, shared=False):
        current, current_crc, owned = _owned_snapshots(root)
        owned = [name for name in owned if name == current or os.path.lexists(root / name)]
        name = _new_snapshot_name(root, current, owned)
        # record the new snapshot as ours before it exists: a save killed from here on leaves
        # a directory the next save knows it may remove
        _write_pointer(root, current, current_crc, [*owned, name])
        snap = root / name
        recorded: dict[str, tuple[int, int, int, int]] = {}
        token = _RECORDED.set(recorded)  # files the components complete themselves
        committed = False
        try:
            snap.mkdir()
            writing = _WRITING.set((*_WRITING.get(), Path(os.path.abspath(snap))))
            try:
                yield snap
            finally:
                _WRITING.reset(writing)
                _RECORDED.reset(token)
            files = {}
            for file in _snapshot_files(snap):
                size, crc = _size_and_crc(file, recorded)
                files[file.relative_to(snap).as_posix()] = {"size": size, "crc32": crc}
            manifest = snap / MANIFEST_NAME
            try:
                with open(manifest, "w") as f:
                    f.write(json.dumps({"format_version": FORMAT_VERSION, "files": files}))
                    f.flush()
                    os.fsync(f.fileno())
            except OSError as err:
                raise named_write_error(err, manifest) from err
            for directory in sorted(p for p in snap.rglob("*") if p.is_dir()):
                _fsync_path(directory)  # the entries of the components' own directories
            _fsync_path(snap)
            manifest_crc = _crc32(manifest)
            # the commit: from here on the new snapshot is the checkpoint
            _replace_pointer(root, name, manifest_crc, [*owned, name])
            committed = True
            _fsync_path(root)
        except BaseException:
            if committed:
                # the pointer names the new snapshot and still records the older ones: keep
                # them all (if the rename does not last, the previous pointer names a snapshot
                # that still exists); the next save removes what it no longer needs
                raise
            _remove_snapshot(root, name)
            try:  # forget it again (harmless if this fails: a recorded name may be missing)
                _write_pointer(root, current, current_crc, owned)
            except OSError:
                pass
            raise
        # Committed: drop the older snapshots and those of crashed saves, all recorded as ours.
        for old in owned:
            if old != name:
                _remove_snapshot(root, old)
        try:
            _write_pointer(root, name, manifest_crc, [name])
        except OSError:
            pass  # the pointer still names the new snapshot; the next save forgets the others


def _load_json(path: Path, what: str) -> dict[str, Any]:
    try:
        obj = json.loads(path.read_bytes().decode())
    except (OSError, ValueError) as err:
        raise CheckpointError(f"checkpoint {what} {str(path)!r} is corrupted: {err}") from err
    if not isinstance(obj, dict):
        raise CheckpointError(f"checkpoint {what} {str(path)!r} does not hold a JSON object.")
    return obj


def _manifest_files(manifest: dict[str, Any], manifest_path: Path) -> dict[str, tuple[int, int]]:
    """``{relative path: (size, crc32)}`` of a manifest, checked for shape."""
    files = manifest.get("files")
    out: dict[str, tuple[int, int]] = {}
    if isinstance(files, dict):
        for rel, info in files.items():
            size = info.get("size") if isinstance(info, dict) else None
            crc = info.get("crc32") if isinstance(info, dict) else None
            parts = Path(rel).parts
            if (not isinstance(size, int) or not isinstance(crc, int) or not parts
                    or Path(rel).is_absolute() or ".." in parts):
                break
            out[rel] = (size, crc)
        else:
            return out
    raise CheckpointError(f"checkpoint manifest {str(manifest_path)!r} is corrupted: its file "
                          "list is malformed.")


def verify_checkpoint(path: str | os.PathLike[str]) -> Path:
    """Check the checkpoint at ``path`` and return its snapshot directory.

    Raises :class:`CheckpointError`, naming the file at fault, when the path is missing, the
    pointer or the manifest is damaged, the format version differs, or a file is missing,
    truncated or corrupted (size or CRC-32 mismatch). It takes no lock: use
    :func:`open_checkpoint` to read while other processes may save to ``path``.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     with write_checkpoint(d) as snap:
    ...         _ = (snap / "a.txt").write_text("a")
    ...     _ = (verify_checkpoint(d) / "a.txt").write_text("b")  # same size, other bytes
    ...     try:
    ...         verify_checkpoint(d)
    ...     except CheckpointError as err:
    ...         print(str(err).endswith("a.txt' is corrupted (CRC-32 mismatch)."))
    True
    """
    root = Path(path)
    meta = _read_pointer(root)
    name = meta.get("snapshot")
    if name is None:
        raise CheckpointError(
            f"no complete checkpoint at {str(root)!r}: the first save to it did not finish.")
    snap = root / str(name)
    manifest_path = snap / MANIFEST_NAME
    if not manifest_path.is_file():
        raise CheckpointError(
            f"checkpoint manifest {str(manifest_path)!r} is missing: the snapshot is incomplete.")
    expected_crc = meta.get("manifest_crc32")
    crc_ok = expected_crc is None or _crc32(manifest_path) == expected_crc
    try:
        manifest = _load_json(manifest_path, "manifest")
    except CheckpointError as err:
        if crc_ok:
            raise
        raise CheckpointError(f"checkpoint manifest {str(manifest_path)!r} is corrupted "
                              "(CRC-32 mismatch).") from err
    if manifest.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint manifest {str(manifest_path)!r} has format version "
            f"{manifest.get('format_version')!r}; expected {FORMAT_VERSION}."
        )
    if not crc_ok:
        raise CheckpointError(
            f"checkpoint manifest {str(manifest_path)!r} is corrupted (CRC-32 mismatch).")
    for rel, (expected_size, crc) in _manifest_files(manifest, manifest_path).items():
        file = snap / rel
        if not file.is_file():
            raise CheckpointNotFoundError(f"checkpoint file {str(file)!r} is missing.")
        size = file.stat().st_size
        if size != expected_size:
            raise CheckpointError(
                f"checkpoint file {str(file)!r} is truncated or altered: {size} bytes, "
                f"expected {expected_size}."
            )
        if _crc32(file) != crc:
            raise CheckpointError(f"checkpoint file {str(file)!r} is corrupted (CRC-32 mismatch).")
    return snap


@contextmanager
def open_checkpoint(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Verify the checkpoint at ``path`` and yield its snapshot directory for reading.

    A shared lock is held until the block ends, so a concurrent save to ``path`` waits and
    cannot remove the snapshot being read.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     with write_checkpoint(d) as snap:
    ...         _ = (snap / "n.txt").write_text("1")
    ...     with open_checkpoint(d) as snap:
    ...         print((snap / "n.txt").read_text())
    1
    """
    root = Path(path)
    if not root.is_dir():
        verify_checkpoint(root)  # raises, naming what is missing
    with _locked(root, shared=True):
        yield verify_checkpoint(root)


class _CheckedWrites:
    """The file ``torch.save`` writes through: keeps the ``OSError`` of a failed write (torch
    reports a ``RuntimeError`` of its own, e.g. "unexpected pos", naming neither the file nor
    the cause), the number of bytes written and their CRC-32."""

    def __init__(self, file: Any) -> None:
        self.file = file
        self.error: OSError | None = None
        self.size = 0
        self.crc = 0

    def write(self, data: Any) -> int:
        try:
            written = self.file.write(data)
        except OSError as err:
            self.error = err
            raise
        self.size += len(memoryview(data).cast("B"))
        self.crc = zlib.crc32(data, self.crc)
        return int(written)

    def flush(self) -> None:
        self.file.flush()


def save_torch_file(obj: Any, path: str | os.PathLike[str], *, what: str = "the state",
                    weights_only: bool = True) -> None:
    """``torch.save(obj, path)`` for a file of a checkpoint.

    A file read back with ``torch.load(weights_only=True)`` (``weights_only``, the default:
    every state of a buffer's parts) is checked first: a value that reader refuses raises
    ``TypeError`` naming it within ``what`` (:func:`~tdreplay.core.loadable_state.
    check_loadable_state`), before anything is written.

    A failed write (a full disk, a file-size limit, an I/O error) raises the ``OSError`` it
    is, with its errno and ``path`` (torch's own error is a ``RuntimeError`` naming neither).
    The file is fsynced and, inside :func:`write_checkpoint`, recorded with the CRC-32 of the
    bytes written (:func:`record_written_file`), which spares reading it back.

    Examples
    --------
    >>> import tempfile, torch
    >>> with tempfile.TemporaryDirectory() as d:
    ...     with write_checkpoint(d) as snap:
    ...         save_torch_file({"x": torch.arange(3)}, snap / "state.pt")
    ...     torch.load(verify_checkpoint(d) / "state.pt")
    {'x': tensor([0, 1, 2])}
    """
    import torch

    from .loadable_state import check_loadable_state

    if weights_only:
        check_loadable_state(obj, what)
    path = Path(path)
    try:
        with open(path, "wb") as file:
            writes = _CheckedWrites(file)
            try:
                torch.save(obj, writes)  # type: ignore[arg-type]  # (a file-like object)
            except RuntimeError as err:
                if writes.error is None:
                    raise
                raise OSError(writes.error.errno, writes.error.strerror, str(path)) from err
            file.flush()
            os.fsync(file.fileno())
            whole = os.fstat(file.fileno()).st_size == writes.size  # (written in order, once)
    except OSError as err:  # (the buffered bytes written at flush or close name no file)
        raise named_write_error(err, path) from err
    if whole:
        record_written_file(path, writes.crc)


def load_torch_file(path: str | os.PathLike[str], *, weights_only: bool = True) -> Any:
    """``torch.load(path, weights_only=weights_only)`` of a checkpoint's file: any file that
    cannot be read is a damaged checkpoint (:class:`CheckpointError` naming it), the
    counterpart of :func:`save_torch_file`. ``weights_only=False`` unpickles: load only
    checkpoints you trust.

    Examples
    --------
    >>> import tempfile, torch
    >>> with tempfile.TemporaryDirectory() as d:
    ...     save_torch_file({"x": torch.arange(2)}, f"{d}/state.pt")
    ...     load_torch_file(f"{d}/state.pt")
    {'x': tensor([0, 1])}
    """
    import torch

    try:
        return torch.load(path, weights_only=weights_only)
    except Exception as err:  # any unreadable file is a damaged checkpoint
        raise CheckpointError(f"checkpoint file {str(path)!r} is unreadable: {err}") from err


def named_write_error(err: OSError, path: str | os.PathLike[str]) -> OSError:
    """A new ``OSError`` of ``err``'s errno (and subclass) for a failed write of the checkpoint
    file ``path``, naming the file ``err`` names, else ``path`` (a write through a Python file
    object past a file-size limit raises ``[Errno 27] File too large`` naming no file).

    Examples
    --------
    >>> import errno
    >>> named = named_write_error(OSError(errno.EFBIG, "File too large"), "/c/blobs.bin")
    >>> named.errno == errno.EFBIG, named.filename, named.strerror
    (True, '/c/blobs.bin', 'File too large (writing a checkpoint file)')
    >>> type(named_write_error(OSError(errno.ENOENT, "No such file", "/c/x"), "/c/y")).__name__
    'FileNotFoundError'
    """
    if err.errno is None:
        return OSError(f"cannot write the checkpoint file {str(path)!r}: {err}")
    if err.filename is not None:
        return OSError(err.errno, err.strerror, err.filename)
    return OSError(err.errno, f"{err.strerror} (writing a checkpoint file)", str(path))


def write_json(path: Path, obj: dict[str, Any]) -> None:
    """Write ``obj`` as JSON (helper for components' metadata files). A failed write (a full
    disk, a file-size limit) raises its ``OSError`` naming ``path``.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     write_json(Path(d) / "meta.json", {"rows": 3})
    ...     read_json(Path(d) / "meta.json")
    {'rows': 3}
    """
    try:
        path.write_text(json.dumps(obj, indent=1, sort_keys=True))
    except OSError as err:
        raise named_write_error(err, path) from err


def read_json(path: Path) -> dict[str, Any]:
    """Read a JSON metadata file written by :func:`write_json`.

    Raises :class:`CheckpointError` naming ``path`` when it is missing or is not a JSON
    object.
    """
    if not path.is_file():
        raise CheckpointNotFoundError(f"checkpoint file {str(path)!r} is missing.")
    return _load_json(path, "file")
