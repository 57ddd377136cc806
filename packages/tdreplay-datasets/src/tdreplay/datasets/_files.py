"""Directories that appear whole or not at all: build beside the target, publish by renaming."""

from __future__ import annotations

import os
import shutil
import socket
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


def _scratch_prefix(target: Path) -> str:
    """The name every scratch directory beside ``target`` made by this process starts with:
    the host and process id tell a scratch directory whose process died (see
    :func:`_remove_dead_scratch`)."""
    return f".{target.name}.tmp-{socket.gethostname()}-{os.getpid()}-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # (another user's process)
        return True
    return True


def _remove_dead_scratch(target: Path) -> None:
    """Remove the scratch directories beside ``target`` left by processes of this host that
    died (a killed conversion, a crash while replacing ``target``): each is a full copy of a
    dataset at worst. Those of live processes, and of other hosts, are left alone."""
    mine = f".{target.name}.tmp-{socket.gethostname()}-"
    try:
        entries = list(target.parent.iterdir())
    except OSError:
        return
    for entry in entries:
        if not entry.name.startswith(mine):
            continue
        pid = entry.name[len(mine):].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            shutil.rmtree(entry, ignore_errors=True)


@contextmanager
def staging_dir(target: Path) -> Iterator[Path]:
    """A scratch directory beside ``target``, removed on exit whatever happens.

    It lives in ``target``'s parent (created if needed), so :func:`publish` can move what was
    built in it to ``target`` with one rename. When the block raises, the parent directories
    this call had to create are removed again (if still empty): a failed build leaves nothing
    behind. Scratch directories that processes of this host left there when they died are
    removed first.
    """
    created = _missing_parents(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_dead_scratch(target)
    scratch = Path(tempfile.mkdtemp(prefix=_scratch_prefix(target), dir=target.parent))
    try:
        yield scratch
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        remove_empty_dirs(created)
        raise
    shutil.rmtree(scratch, ignore_errors=True)


def _move_aside(path: Path) -> Path:
    """Rename the directory ``path`` into a new scratch directory beside it (returned, for the
    caller to remove); a ``path`` another process moved or removed meanwhile is not an error."""
    aside = Path(tempfile.mkdtemp(prefix=_scratch_prefix(path), dir=path.parent))
    try:
        os.replace(path, aside / "old")
    except FileNotFoundError:  # (gone already: another process removed or replaced it)
        pass
    except BaseException:
        shutil.rmtree(aside, ignore_errors=True)
        raise
    return aside


def publish(built: Path, target: Path, *, replace: bool = False) -> bool:
    """Move the directory ``built`` to ``target`` with one rename.

    An empty directory at ``target`` is replaced. A non-empty one is replaced when ``replace``
    is true: it is first renamed aside (into a scratch directory, removed once ``built`` is in
    place), so a crash leaves either the old directory, or no directory (the next call
    converts again), never a half-removed one; readers see the old or the new directory, or
    for an instant none. Otherwise, or when another process published first, ``built`` is
    left where it is and ``False`` is returned.
    """
    aside = _move_aside(target) if replace and target.exists() else None
    try:
        os.replace(built, target)
    except OSError:
        if target.is_dir() and any(target.iterdir()):
            return False
        raise
    finally:
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)
    return True


def remove_dir(path: Path) -> None:
    """Remove the directory ``path`` as one step: it is renamed aside first (into a scratch
    directory beside it), then deleted. Readers and a crash see the whole directory or none
    (``rmtree`` in place can leave a conversion's marker with some of its files gone), and a
    directory another process removes meanwhile is not an error."""
    shutil.rmtree(_move_aside(path), ignore_errors=True)


def check_empty_destination(dest: Path, name: str) -> None:
    """Raise ``FileExistsError`` unless ``dest`` is missing or an empty directory."""
    if not dest.exists():
        return
    if not dest.is_dir():
        raise FileExistsError(f"{name} {str(dest)!r} exists and is not a directory.")
    if any(dest.iterdir()):
        raise FileExistsError(f"{name} {str(dest)!r} is not empty: pass a new or empty "
                              "directory.")


#: what identifies one version of a file: ``(inode, size, mtime_ns)``; a conversion writes new
#: files and renames them into place, so a new version differs in each
FileVersion = tuple[int, int, int]


def file_versions(data: object) -> dict[str, FileVersion]:
    """The files behind the memory-mapped leaves of TensorDict ``data`` and their versions
    (nothing for leaves in memory)."""
    versions: dict[str, FileVersion] = {}
    for leaf in data.values(include_nested=True, leaves_only=True):  # type: ignore[attr-defined]
        name = getattr(leaf, "filename", None)
        if name and name not in versions:
            versions[name] = _version_of(name)
    return versions


def _version_of(name: str) -> FileVersion:
    stat = os.stat(name)
    return (stat.st_ino, stat.st_size, stat.st_mtime_ns)


def changed_files(versions: dict[str, FileVersion]) -> list[str]:
    """Those of the files ``versions`` lists that are gone or were replaced since."""
    changed = []
    for name, version in versions.items():
        try:
            if _version_of(name) != version:
                changed.append(name)
        except OSError:
            changed.append(name)
    return changed
