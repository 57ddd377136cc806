"""Small files replaced whole: a reader sees the old file or the new one, never a part of one.

Metadata beside data files (a memory-mapped storage's layout and configuration, a sharded
checkpoint's manifest, a replay journal) is rewritten in place while the data stays. Writing
such a file directly, a killed process or a full disk leaves it empty or cut short, and the
data it describes unreadable. :func:`replace_file` writes a temporary file beside it and
renames it over the old one (an atomic step on POSIX file systems).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path

__all__ = ["fsync_path", "replace_file"]


def fsync_path(path: str | os.PathLike[str]) -> None:
    """Flush the file or directory ``path`` to disk (a directory: its entries, e.g. a rename
    into it), so that it survives a power loss.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     fsync_path(d)
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_file(path: str | os.PathLike[str], data: bytes, *, durable: bool = True) -> None:
    """Write ``data`` as the whole content of the file ``path``, atomically: into a temporary
    file beside it (a name of its own for every call, so threads and processes writing the same
    file do not meet), then renamed over ``path``.

    A process killed at any moment leaves ``path`` as it was or as ``data``; a failure (a full
    disk: ``OSError``) removes the temporary file and leaves ``path`` as it was.
    ``durable=True`` also flushes the file before the rename and the directory after it, so
    that the new content survives a power loss; ``durable=False`` is for files that only need
    to survive the process (what the page cache holds is safe from a killed process).

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> with tempfile.TemporaryDirectory() as d:
    ...     target = Path(d) / "layout.json"
    ...     replace_file(target, b'{"rows": 8}')
    ...     replace_file(target, b'{"rows": 16}', durable=False)
    ...     print(target.read_text(), sorted(p.name for p in Path(d).iterdir()))
    {"rows": 16} ['layout.json']
    """
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:12]}.tmp")
    # (created as open() creates files: the umask decides who may read it)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_path(target.parent)
