"""Files whose writer records their CRC-32 (``record_written_file``) are not read back at
commit, and a file changed after it was recorded is read back; loading checks every file."""

from __future__ import annotations

import json
import os
import zlib

import pytest

from tdreplay.core.checkpoint import (
    MANIFEST_NAME,
    CheckpointError,
    record_written_file,
    verify_checkpoint,
    write_checkpoint,
)


def _write_synced(path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _manifest(snap):
    return json.loads((snap / MANIFEST_NAME).read_text())["files"]


def test_recorded_crc_goes_into_the_manifest(tmp_path, monkeypatch):
    read_back = []
    import tdreplay.core.checkpoint as checkpoint

    original = checkpoint._crc32
    monkeypatch.setattr(checkpoint, "_crc32", lambda p: read_back.append(p.name) or original(p))
    with write_checkpoint(tmp_path) as snap:
        _write_synced(snap / "recorded.bin", b"x" * 1000)
        assert record_written_file(snap / "recorded.bin", zlib.crc32(b"x" * 1000))
        _write_synced(snap / "plain.bin", b"y" * 10)
    assert "recorded.bin" not in read_back and "plain.bin" in read_back
    files = _manifest(verify_checkpoint(tmp_path))
    assert files["recorded.bin"] == {"size": 1000, "crc32": zlib.crc32(b"x" * 1000)}
    assert files["plain.bin"] == {"size": 10, "crc32": zlib.crc32(b"y" * 10)}


def test_a_file_changed_after_it_was_recorded_is_read_back(tmp_path):
    with write_checkpoint(tmp_path) as snap:
        _write_synced(snap / "a.bin", b"old-data")
        record_written_file(snap / "a.bin", zlib.crc32(b"old-data"))
        os.utime(snap / "a.bin", ns=(1, 1))  # rewritten since: another modification time
        _write_synced(snap / "a.bin", b"new-data-longer")
    snap = verify_checkpoint(tmp_path)
    assert _manifest(snap)["a.bin"]["crc32"] == zlib.crc32(b"new-data-longer")


def test_a_wrong_recorded_crc_is_caught_when_loading(tmp_path):
    with write_checkpoint(tmp_path) as snap:
        _write_synced(snap / "a.bin", b"data")
        record_written_file(snap / "a.bin", zlib.crc32(b"other"))  # what the writer claims
    with pytest.raises(CheckpointError, match="a.bin' is corrupted"):
        verify_checkpoint(tmp_path)


def test_recording_outside_a_checkpoint_does_nothing(tmp_path):
    _write_synced(tmp_path / "a.bin", b"data")
    assert record_written_file(tmp_path / "a.bin", 0) is False
