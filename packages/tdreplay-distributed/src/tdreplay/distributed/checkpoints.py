"""Where a buffer actor's checkpoints go: a path on its node, a shared path, or an fsspec URL.

A path is used as is by the actor, on the node it runs on: to survive the loss of that node,
give a path on storage every node mounts (NFS, a cluster file system). A URL with a scheme
(``s3://bucket/replay``, ``gs://...``, ``file:///shared/...``, ``memory://...``) is handled
by `fsspec <https://filesystem-spec.readthedocs.io>`_ (``pip install
"tdreplay-distributed[fsspec]"`` and the driver of the scheme, e.g. ``s3fs``).

Local and shared paths keep core's atomic checkpoints. At a URL, object stores have no atomic
rename of a directory, so a checkpoint is committed by one single-object write instead: the
snapshot is written in full under a new name (``URL/snapshot-<time>-<random>/``, from a local
temporary directory), then the pointer ``URL/LATEST`` is written to name it (a one-object
``PUT`` is atomic on S3, GCS and file systems), then older snapshots are removed. A crash
before the pointer is written leaves the previous checkpoint in force; loading reads the
snapshot the pointer names.
"""

from __future__ import annotations

import os
import posixpath
import tempfile
import time
import uuid
from typing import Any

from tdreplay.core import CheckpointError, ReplayBuffer
from tdreplay.core.atomic_files import replace_file
from tdreplay.core.checkpoint import CheckpointNotFoundError, open_checkpoint

__all__ = ["POINTER", "check_checkpoint", "checkpoint_if_any", "is_url", "join_location",
           "load_checkpoint", "read_text", "resolve_location", "save_checkpoint", "write_text"]

#: the object that names the snapshot in force at a URL
POINTER = "LATEST"
_SNAPSHOT = "snapshot-"


def is_url(location: str) -> bool:
    """Whether ``location`` is a URL (``scheme://...``) rather than a path.

    >>> is_url("s3://bucket/replay"), is_url("memory://ckpt"), is_url("/shared/replay")
    (True, True, False)
    """
    scheme, sep, _ = location.partition("://")
    return bool(sep) and scheme.replace("+", "").replace("-", "").isalnum()


def resolve_location(location: str | os.PathLike[str]) -> str:
    """A URL as is; a path made absolute (on the caller's machine: give shared paths)."""
    text = os.fspath(location)
    return text if is_url(text) else os.path.abspath(text)


def join_location(location: str, name: str) -> str:
    """``name`` under ``location`` (a path or a URL).

    >>> join_location("s3://bucket/replay/", "shard-0"), join_location("/shared", "shard-1")
    ('s3://bucket/replay/shard-0', '/shared/shard-1')
    """
    if is_url(location):
        return f"{location.rstrip('/')}/{name}"
    return os.path.join(location, name)


def _filesystem(url: str) -> tuple[Any, str]:
    try:
        import fsspec  # type: ignore[import-untyped]
    except ImportError as err:
        raise ImportError(f"checkpoint location {url!r} is a URL, which needs fsspec (pip install "
                          "\"tdreplay-distributed[fsspec]\" and the driver of its scheme, e.g. "
                          "s3fs); or give a path on storage every node mounts.") from err
    fs, path = fsspec.core.url_to_fs(url)
    return fs, path.rstrip("/")


def write_text(location: str, text: str) -> None:
    """Write a small text file at ``location`` (a path: atomically and durably, see
    :func:`~tdreplay.core.atomic_files.replace_file`; a URL: one object written at once)."""
    if is_url(location):
        fs, path = _filesystem(location)
        fs.makedirs(posixpath.dirname(path), exist_ok=True)
        fs.pipe_file(path, text.encode())
        return
    replace_file(location, text.encode())


def read_text(location: str) -> str:
    """The text file at ``location`` (a path or a URL); ``OSError`` if there is none."""
    if is_url(location):
        fs, path = _filesystem(location)
        return bytes(fs.cat_file(path)).decode()
    with open(location) as f:
        return f.read()


def save_checkpoint(buffer: ReplayBuffer, location: str) -> None:
    """``buffer.dumps`` to ``location`` (a path, or a URL through fsspec: see the module
    docstring for how it is committed)."""
    if not is_url(location):
        buffer.dumps(location)
        return
    fs, path = _filesystem(location)
    snapshot = f"{_SNAPSHOT}{time.time_ns()}-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory(prefix="tdreplay-ckpt-") as tmp:
        buffer.dumps(tmp)
        for folder, _, files in os.walk(tmp):
            relative = os.path.relpath(folder, tmp)
            target = posixpath.join(path, snapshot, *([] if relative == os.curdir
                                                      else relative.split(os.sep)))
            fs.makedirs(target, exist_ok=True)
            for name in files:
                fs.put_file(os.path.join(folder, name), posixpath.join(target, name))
    fs.pipe_file(posixpath.join(path, POINTER), snapshot.encode())  # the commit
    for entry in fs.ls(path, detail=False):
        name = posixpath.basename(entry.rstrip("/"))
        if name.startswith(_SNAPSHOT) and name != snapshot:
            _remove_tree(fs, entry)


def _remove_tree(fs: Any, root: str) -> None:
    """Remove ``root`` and what it holds, file by file (``fs.rm`` would read ``[``, ``*`` in
    a name as a glob), best effort: a stale snapshot left behind is only wasted space."""
    entries = fs.find(root, withdirs=True, detail=True)
    for entry, detail in sorted(entries.items(), key=lambda item: -len(item[0])):
        try:
            if detail["type"] == "directory":
                fs.rmdir(entry)
            else:
                fs.rm_file(entry)
        except OSError:
            pass
    try:
        fs.rmdir(root)
    except OSError:
        pass


def _committed_snapshot(fs: Any, path: str, location: str) -> str:
    """The snapshot directory the pointer at the URL ``location`` (``path`` in ``fs``) names;
    ``CheckpointError`` when there is none."""
    try:
        snapshot = bytes(fs.cat_file(posixpath.join(path, POINTER))).decode().strip()
    except FileNotFoundError:
        raise CheckpointNotFoundError(f"no checkpoint at {location!r} (no {POINTER} pointer: it "
                                      "was never committed).") from None
    source = posixpath.join(path, snapshot)
    if not snapshot.startswith(_SNAPSHOT) or not fs.isdir(source):
        raise CheckpointError(f"the checkpoint at {location!r} names a snapshot {snapshot!r} "
                              "that is not there.")
    return source


def check_checkpoint(location: str) -> None:
    """``CheckpointError`` (``CheckpointNotFoundError``, a ``FileNotFoundError``, when there is
    none) unless ``location`` (a path or a URL) holds a committed checkpoint: at a path, every
    file checked against its size and CRC-32 (:func:`~tdreplay.core.checkpoint.open_checkpoint`);
    at a URL, the snapshot its pointer names. Asked before anything is given up for it (an
    actor respawned from it).

    Examples
    --------
    >>> import tempfile
    >>> from tdreplay.core import ListStorage, ReplayBuffer
    >>> with tempfile.TemporaryDirectory() as d:
    ...     ReplayBuffer(storage=ListStorage(4)).dumps(d)
    ...     check_checkpoint(d)
    ...     try:
    ...         check_checkpoint(d + "/missing")
    ...     except FileNotFoundError as err:
    ...         print(type(err).__name__)
    CheckpointNotFoundError
    """
    if is_url(location):
        fs, path = _filesystem(location)
        _committed_snapshot(fs, path, location)
    else:
        with open_checkpoint(location):  # (verified under its lock: no save removes it meanwhile)
            pass


def checkpoint_if_any(location: str | None) -> str | None:
    """``location`` when it holds a committed checkpoint (checked as :func:`check_checkpoint`
    checks it), ``None`` when ``location`` is ``None`` or holds none yet; a damaged one
    raises its ``CheckpointError``. What a respawn without a path restores: the buffer's
    ``checkpoint_path``, once something was saved there.

    Examples
    --------
    >>> import tempfile
    >>> from tdreplay.core import ListStorage, ReplayBuffer
    >>> with tempfile.TemporaryDirectory() as d:
    ...     print(checkpoint_if_any(d + "/never-saved"))
    ...     ReplayBuffer(storage=ListStorage(4)).dumps(d + "/saved")
    ...     print(checkpoint_if_any(d + "/saved") == d + "/saved")
    None
    True
    """
    if location is None:
        return None
    try:
        check_checkpoint(location)
    except CheckpointNotFoundError:
        return None
    return location


def load_checkpoint(buffer: ReplayBuffer, location: str) -> None:
    """``buffer.loads`` from ``location`` (a path, or a URL through fsspec: the snapshot
    its ``LATEST`` pointer names)."""
    if not is_url(location):
        buffer.loads(location)
        return
    fs, path = _filesystem(location)
    source = _committed_snapshot(fs, path, location)
    with tempfile.TemporaryDirectory(prefix="tdreplay-ckpt-") as tmp:
        for remote, entry in sorted(fs.find(source, withdirs=True, detail=True).items()):
            local = os.path.join(tmp, *posixpath.relpath(remote, source).split("/"))
            if entry["type"] == "directory":
                os.makedirs(local, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(local), exist_ok=True)
                fs.get_file(remote, local)
        buffer.loads(tmp)
