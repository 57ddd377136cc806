"""replace_file: a file rewritten whole or not at all, whatever fails on the way."""

from __future__ import annotations

import errno
import os
import stat
import threading
from pathlib import Path

import pytest

from tdreplay.core import atomic_files
from tdreplay.core.atomic_files import replace_file


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


@pytest.mark.parametrize("durable", [True, False])
def test_replaces_the_whole_content(tmp_path: Path, durable: bool) -> None:
    target = tmp_path / "layout.json"
    target.write_bytes(b"x" * 100)
    replace_file(target, b"short", durable=durable)
    assert target.read_bytes() == b"short"
    assert _leftovers(tmp_path) == []


def test_a_full_disk_leaves_the_old_file_and_no_temporary(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "manifest.json"
    target.write_bytes(b"old")
    real_fdopen = os.fdopen

    class FullDisk:
        def __init__(self, fd: int, mode: str) -> None:
            self.file = real_fdopen(fd, mode)

        def __enter__(self) -> FullDisk:
            return self

        def __exit__(self, *exc: object) -> None:
            self.file.close()

        def write(self, data: bytes) -> int:
            self.file.write(data[:2])  # part of it reaches the temporary file
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic_files.os, "fdopen", FullDisk)
    with pytest.raises(OSError, match="No space left"):
        replace_file(target, b"new content")
    assert target.read_bytes() == b"old"
    assert _leftovers(tmp_path) == []


def test_a_failed_rename_leaves_the_old_file_and_no_temporary(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "state"
    target.write_bytes(b"old")

    def refuse(src: str, dst: str) -> None:
        raise PermissionError(errno.EACCES, "refused", dst)

    monkeypatch.setattr(atomic_files.os, "replace", refuse)
    with pytest.raises(PermissionError):
        replace_file(target, b"new")
    assert target.read_bytes() == b"old"
    assert _leftovers(tmp_path) == []


def test_the_umask_decides_the_mode(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        replace_file(tmp_path / "config.json", b"{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "config.json").stat().st_mode) == 0o644


def test_threads_rewriting_one_file_leave_one_whole_version(tmp_path: Path) -> None:
    target = tmp_path / "journal"
    versions = [bytes([i]) * (1000 + i) for i in range(8)]

    def rewrite(content: bytes) -> None:
        for _ in range(25):
            replace_file(target, content, durable=False)

    threads = [threading.Thread(target=rewrite, args=(v,)) for v in versions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert target.read_bytes() in versions
    assert _leftovers(tmp_path) == []
