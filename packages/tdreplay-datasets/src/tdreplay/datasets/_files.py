"""Directories that appear whole or not at all: build beside the target, publish by renaming."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _missing_parents(path: Path) -> list[Path]:
    """The ancestors of ``path`` that do not exist yet, deepest first."""
    missing = []
    for parent in path.parents:
        if parent.exists():
            break
        missing.append(parent)
    return missing


def remove_empty_dirs(dirs: list[Path]) -> None:
    """Remove each of ``dirs`` (deepest first) that is an empty directory; stop at the first
    one that is not."""
    for directory in dirs:
        try:
            directory.rmdir()
        except OSError:  # not empty, or gone already
            break


@contextmanager
def staging_dir(target: Path) -> Iterator[Path]:
    """A scratch directory beside ``target``, removed on exit whatever happens.

    It lives in ``target``'s parent (created if needed), so :func:`publish` can move what was
    built in it to ``target`` with one rename. When the block raises, the parent directories
    this call had to create are removed again (if still empty): a failed build leaves nothing
    behind.
    """
    created = _missing_parents(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        yield scratch
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        remove_empty_dirs(created)
        raise
    shutil.rmtree(scratch, ignore_errors=True)


def publish(built: Path, target: Path, *, replace: bool = False) -> bool:
    """Move the directory ``built`` to ``target`` with one rename.

    An empty directory at ``target`` is replaced. A non-empty one is replaced when ``replace``
    is true (removed, then renamed over: readers see either the old or the new directory, or
    for an instant none); otherwise ``built`` is left where it is and ``False`` is returned
    (another process published the same thing first).
    """
    if replace and target.exists():
        shutil.rmtree(target)
    try:
        os.replace(built, target)
    except OSError:
        if target.is_dir() and any(target.iterdir()):
            return False
        raise
    return True


def check_empty_destination(dest: Path, name: str) -> None:
    """Raise ``FileExistsError`` unless ``dest`` is missing or an empty directory."""
    if not dest.exists():
        return
    if not dest.is_dir():
        raise FileExistsError(f"{name} {str(dest)!r} exists and is not a directory.")
    if any(dest.iterdir()):
        raise FileExistsError(f"{name} {str(dest)!r} is not empty: pass a new or empty "
                              "directory.")
