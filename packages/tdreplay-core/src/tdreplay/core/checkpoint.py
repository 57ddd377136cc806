"""Crash-safe checkpoint directories.

A checkpoint written at ``path`` is laid out as::

    path/
      tdreplay-checkpoint.json      # pointer: format version + name of the current snapshot
      snapshot-<n>-<uuid>/          # one complete snapshot
        manifest.json               # size and CRC-32 of every file of the snapshot
        ...                         # whatever the components wrote

A new snapshot is written completely (files flushed and fsynced, manifest last) *beside* the
current one, then the pointer file is replaced atomically with :func:`os.replace`, and only
then are older snapshots removed. A process killed at any moment therefore leaves either the
previous checkpoint or the new one loadable, never a half-written one: the pointer only ever
names a complete snapshot. :func:`open_checkpoint` checks the format version and every file's
size and CRC before returning, so a truncated or corrupted checkpoint is refused before a
buffer changes.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

FORMAT_VERSION = 1
POINTER_NAME = "tdreplay-checkpoint.json"
MANIFEST_NAME = "manifest.json"
_CHUNK = 1 << 22


class CheckpointError(RuntimeError):
    """Raised when a checkpoint is missing, corrupted, of another format, or does not match."""


def _crc32(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _snapshot_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST_NAME)


def _read_pointer(path: Path) -> dict[str, Any]:
    pointer = path / POINTER_NAME
    if not path.exists():
        raise CheckpointError(f"no checkpoint at {str(path)!r}: the path does not exist.")
    if not pointer.is_file():
        raise CheckpointError(
            f"no tdreplay checkpoint at {str(path)!r}: {POINTER_NAME} is missing "
            "(was it written with ReplayBuffer.dumps?)."
        )
    try:
        meta = json.loads(pointer.read_text())
    except (OSError, ValueError) as err:
        raise CheckpointError(f"checkpoint pointer {str(pointer)!r} is unreadable: {err}") from err
    if not isinstance(meta, dict):
        raise CheckpointError(f"checkpoint pointer {str(pointer)!r} does not hold a JSON object.")
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint at {str(path)!r} has format version {version!r}; this tdreplay reads "
            f"format version {FORMAT_VERSION}."
        )
    return meta


@contextmanager
def write_checkpoint(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Context manager giving a fresh snapshot directory; commits it atomically on exit.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> with tempfile.TemporaryDirectory() as d:
    ...     with write_checkpoint(d) as snap:
    ...         _ = (snap / "hello.txt").write_text("hi")
    ...     with open_checkpoint(d) as snap:
    ...         print((snap / "hello.txt").read_text())
    hi
    """
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    previous = None
    if (root / POINTER_NAME).is_file():
        try:
            previous = json.loads((root / POINTER_NAME).read_text()).get("snapshot")
        except (OSError, ValueError):
            previous = None
    counter = 0
    if previous and previous.startswith("snapshot-"):
        try:
            counter = int(previous.split("-")[1]) + 1
        except (IndexError, ValueError):
            counter = 0
    name = f"snapshot-{counter:06d}-{uuid.uuid4().hex[:8]}"
    snap = root / name
    snap.mkdir()
    try:
        yield snap
        files = {}
        for file in _snapshot_files(snap):
            _fsync_path(file)
            files[file.relative_to(snap).as_posix()] = {
                "size": file.stat().st_size,
                "crc32": _crc32(file),
            }
        manifest = snap / MANIFEST_NAME
        manifest.write_text(json.dumps({"format_version": FORMAT_VERSION, "files": files}))
        _fsync_path(manifest)
        _fsync_path(snap)
        tmp_pointer = root / f".{POINTER_NAME}.{uuid.uuid4().hex[:8]}.tmp"
        tmp_pointer.write_text(json.dumps({"format_version": FORMAT_VERSION, "snapshot": name}))
        _fsync_path(tmp_pointer)
        os.replace(tmp_pointer, root / POINTER_NAME)
        _fsync_path(root)
    except BaseException:
        shutil.rmtree(snap, ignore_errors=True)
        raise
    # The new snapshot is committed: drop older snapshots and leftovers of crashed writes.
    for entry in root.iterdir():
        if entry.name.startswith("snapshot-") and entry.name != name:
            shutil.rmtree(entry, ignore_errors=True)
        elif entry.name.startswith(f".{POINTER_NAME}.") and entry.name.endswith(".tmp"):
            entry.unlink(missing_ok=True)


def verify_checkpoint(path: str | os.PathLike[str]) -> Path:
    """Check the checkpoint at ``path`` and return its snapshot directory.

    Raises :class:`CheckpointError` when the path is missing, the format version differs, or a
    file is missing, truncated or corrupted (size or CRC-32 mismatch).
    """
    root = Path(path)
    meta = _read_pointer(root)
    snap = root / str(meta.get("snapshot"))
    manifest_path = snap / MANIFEST_NAME
    if not manifest_path.is_file():
        raise CheckpointError(
            f"checkpoint snapshot {str(snap)!r} has no manifest: it is incomplete.")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as err:
        raise CheckpointError(
            f"checkpoint manifest {str(manifest_path)!r} is corrupted: {err}") from err
    if manifest.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint manifest has format version {manifest.get('format_version')!r}; "
            f"expected {FORMAT_VERSION}."
        )
    for rel, info in manifest["files"].items():
        file = snap / rel
        if not file.is_file():
            raise CheckpointError(f"checkpoint file {str(file)!r} is missing.")
        size = file.stat().st_size
        if size != info["size"]:
            raise CheckpointError(
                f"checkpoint file {str(file)!r} is truncated or altered: {size} bytes, "
                f"expected {info['size']}."
            )
        if _crc32(file) != info["crc32"]:
            raise CheckpointError(f"checkpoint file {str(file)!r} is corrupted (CRC-32 mismatch).")
    return snap


@contextmanager
def open_checkpoint(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Verify the checkpoint at ``path`` and yield its snapshot directory for reading."""
    yield verify_checkpoint(path)


def write_json(path: Path, obj: dict[str, Any]) -> None:
    """Write ``obj`` as JSON (helper for components' metadata files)."""
    path.write_text(json.dumps(obj, indent=1, sort_keys=True))


def read_json(path: Path) -> dict[str, Any]:
    """Read a JSON metadata file written by :func:`write_json`."""
    if not path.is_file():
        raise CheckpointError(f"checkpoint file {str(path)!r} is missing.")
    obj = json.loads(path.read_text())
    if not isinstance(obj, dict):
        raise CheckpointError(f"checkpoint file {str(path)!r} does not hold a JSON object.")
    return obj
