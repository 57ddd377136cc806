"""Where a buffer actor's checkpoints go: a path on its node, a shared path, or an fsspec URL.

A path is used as is by the actor, on the node it runs on: to survive the loss of that node,
give a path on storage every node mounts (NFS, a cluster file system). A URL with a scheme
(``s3://bucket/replay``, ``gs://...``, ``file:///shared/...``, ``memory://...``) is handled
by `fsspec <https://filesystem-spec.readthedocs.io>`_ when it is installed (tdreplay does not
install it): the checkpoint is written to a local temporary directory, then copied to the URL
(and copied back from it to load). Local and shared paths keep core's atomic checkpoints; a
copy to an object store is as atomic as that store's writes of the files.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

from tdreplay.core import CheckpointError, ReplayBuffer

__all__ = ["is_url", "load_checkpoint", "resolve_location", "save_checkpoint"]


def is_url(location: str) -> bool:
    """Whether ``location`` is a URL (``scheme://...``) rather than a path."""
    scheme, sep, _ = location.partition("://")
    return bool(sep) and scheme.replace("+", "").replace("-", "").isalnum()


def resolve_location(location: str | os.PathLike[str]) -> str:
    """A URL as is; a path made absolute (on the caller's machine: give shared paths)."""
    text = os.fspath(location)
    return text if is_url(text) else os.path.abspath(text)


def _filesystem(url: str) -> tuple[Any, str]:
    try:
        import fsspec  # type: ignore[import-untyped]
    except ImportError as err:
        raise ImportError(f"checkpoint location {url!r} is a URL, which needs fsspec (pip install "
                          "fsspec and the driver of its scheme, e.g. s3fs); or give a path on "
                          "storage every node mounts.") from err
    fs, path = fsspec.core.url_to_fs(url)
    return fs, path


def save_checkpoint(buffer: ReplayBuffer, location: str) -> None:
    """``buffer.dumps`` to ``location`` (a path, or a URL through fsspec)."""
    if not is_url(location):
        buffer.dumps(location)
        return
    fs, path = _filesystem(location)
    with tempfile.TemporaryDirectory(prefix="tdreplay-ckpt-") as tmp:
        buffer.dumps(tmp)
        if fs.exists(path):
            fs.rm(path, recursive=True)
        fs.put(tmp.rstrip("/") + "/", path, recursive=True)


def load_checkpoint(buffer: ReplayBuffer, location: str) -> None:
    """``buffer.loads`` from ``location`` (a path, or a URL through fsspec)."""
    if not is_url(location):
        buffer.loads(location)
        return
    fs, path = _filesystem(location)
    if not fs.exists(path):
        raise CheckpointError(f"no checkpoint at {location!r}.")
    with tempfile.TemporaryDirectory(prefix="tdreplay-ckpt-") as tmp:
        fs.get(path.rstrip("/") + "/", tmp, recursive=True)
        buffer.loads(tmp)
