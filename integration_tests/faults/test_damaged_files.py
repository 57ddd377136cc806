"""Every file ``ReplayBuffer.dumps`` writes, damaged or truncated, is refused by ``loads`` with
a ``CheckpointError`` naming that file, and the buffer loading it stays as it was.

Two kinds of damage: what the checksums see (truncated, emptied, a flipped byte, bytes
appended, deleted), and garbage behind checksums redone to match it (a checkpoint edited by
hand or by a faulty tool), which the file's own reader must refuse.
"""

from __future__ import annotations

import json
import pickle
import zlib
from pathlib import Path

import pytest
import torch

from tdreplay.core import CheckpointError
from tdreplay.core.checkpoint import LOCK_NAME, MANIFEST_NAME, POINTER_NAME, _pointer_body_crc

#: every file core writes for a buffer of ListStorage + RandomSampler + RoundRobinWriter with
#: a generator, relative to the checkpoint directory ("{snap}" is the current snapshot)
FILES = [
    POINTER_NAME,
    "{snap}/" + MANIFEST_NAME,
    "{snap}/buffer.json",
    "{snap}/rng.pt",
    "{snap}/storage/items.pt",
    "{snap}/storage/storage.json",
    "{snap}/storage/seam.json",
    "{snap}/sampler/component.json",
    "{snap}/sampler/state.pt",
    "{snap}/writer/component.json",
    "{snap}/writer/state.pt",
]

DAMAGES = ["truncate_half", "empty", "flip_byte", "append", "delete"]


def saved(faults, path: Path, tensordict: bool):
    family = faults.Family(offset=300, tensordict=tensordict)
    rb = family.build(4)  # wrapped around its capacity
    rb.dumps(path)
    return family, rb


def resolve(path: Path, rel: str) -> Path:
    snap = json.loads((path / POINTER_NAME).read_text())["snapshot"]
    return path / rel.format(snap=snap)


def damage(file: Path, how: str) -> None:
    data = file.read_bytes()
    if how == "truncate_half":
        file.write_bytes(data[: len(data) // 2])
    elif how == "empty":
        file.write_bytes(b"")
    elif how == "flip_byte":
        i = len(data) // 2
        file.write_bytes(data[:i] + bytes([data[i] ^ 0x5A]) + data[i + 1:])
    elif how == "append":
        file.write_bytes(data + b"\x00garbage")
    elif how == "delete":
        file.unlink()


def test_the_list_of_files_is_complete(tmp_path, faults):
    saved(faults, tmp_path, tensordict=False)
    written = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()}
    listed = {resolve(tmp_path, rel).relative_to(tmp_path).as_posix() for rel in FILES}
    assert written == listed | {LOCK_NAME}


@pytest.mark.parametrize("tensordict", [False, True], ids=["list", "tensordict"])
@pytest.mark.parametrize("rel", FILES, ids=lambda r: r.replace("{snap}/", ""))
def test_damaged_file_is_refused_naming_it(tmp_path, faults, tally, rel, tensordict):
    family, _ = saved(faults, tmp_path / "good", tensordict)
    target = family.build(1)
    before = faults.buffer_fingerprint(target)
    for how in DAMAGES:
        path = tmp_path / how
        saved(faults, path, tensordict)
        file = resolve(path, rel)
        damage(file, how)
        with pytest.raises(CheckpointError) as err:
            target.loads(path)
        assert file.name in str(err.value), (how, str(err.value))
        faults.assert_unchanged(target, before)
        tally.injected("damaged or truncated checkpoint file")
    # and the good one still loads
    target.loads(tmp_path / "good")
    faults.assert_same_state(target, family.build(4))


# ---- garbage behind checksums that match it ----------------------------------------------------
def reseal(path: Path, file: Path) -> None:
    """Redo the manifest's entry of ``file`` and the pointer's checksums, as a tool that edits
    checkpoints would: only the file's own reader can tell it is wrong."""
    pointer = path / POINTER_NAME
    meta = json.loads(pointer.read_text())
    manifest = path / meta["snapshot"] / MANIFEST_NAME
    if file != manifest:
        m = json.loads(manifest.read_text())
        rel = file.relative_to(manifest.parent).as_posix()
        data = file.read_bytes()
        m["files"][rel] = {"size": len(data), "crc32": zlib.crc32(data)}
        manifest.write_text(json.dumps(m))
    meta["manifest_crc32"] = zlib.crc32(manifest.read_bytes())
    meta.pop("crc32")
    meta["crc32"] = _pointer_body_crc(meta)
    pointer.write_text(json.dumps(meta))


def _garbage_variants(file: Path) -> list[bytes]:
    if file.suffix == ".json":
        return [b"\xff\xfe not json", b"[1, 2, 3]", b'{"class": 7}']
    if file.suffix == ".pkl":
        return [b"\x80\x05garbage", pickle.dumps({"not": "a list"}), pickle.dumps([1, 2])]
    if file.suffix == ".pt":
        import io

        other = io.BytesIO()
        torch.save(torch.zeros(3, dtype=torch.uint8), other)  # a tensor, not what was saved
        return [b"PK\x03\x04 not a zip", other.getvalue()]
    raise AssertionError(file)


@pytest.mark.parametrize("rel", [r for r in FILES if r != POINTER_NAME],
                         ids=lambda r: r.replace("{snap}/", ""))
def test_garbage_with_matching_checksums_is_refused_naming_the_file(tmp_path, faults, tally,
                                                                    rel):
    family, _ = saved(faults, tmp_path / "probe", tensordict=False)
    target = family.build(2)
    before = faults.buffer_fingerprint(target)
    for i, garbage in enumerate(_garbage_variants(resolve(tmp_path / "probe", rel))):
        path = tmp_path / f"v{i}"
        saved(faults, path, tensordict=False)
        file = resolve(path, rel)
        file.write_bytes(garbage)
        reseal(path, file)
        with pytest.raises(CheckpointError) as err:
            target.loads(path)
        assert file.name in str(err.value), (garbage, str(err.value))
        faults.assert_unchanged(target, before)
        tally.injected("garbage behind matching checksums")


@pytest.mark.parametrize("content", [
    {"format_version": 1, "snapshot": "../elsewhere"},
    {"format_version": 1, "snapshot": None},
    {"format_version": 1, "snapshot": 7},
    {"format_version": 2, "snapshot": "snapshot-000000-00"},
    ["format_version", 1],
])
def test_pointer_with_odd_content_is_refused_naming_it(tmp_path, faults, tally, content):
    family, _ = saved(faults, tmp_path, tensordict=False)
    target = family.build(2)
    before = faults.buffer_fingerprint(target)
    (tmp_path / POINTER_NAME).write_text(json.dumps(content))
    with pytest.raises(CheckpointError, match=r"checkpoint|tdreplay-checkpoint\.json"):
        target.loads(tmp_path)
    faults.assert_unchanged(target, before)
    tally.injected("damaged pointer")


def test_lock_file_content_does_not_matter(tmp_path, faults):
    family, rb = saved(faults, tmp_path, tensordict=False)
    (tmp_path / LOCK_NAME).write_bytes(b"whatever a user or a crash left here")
    restored = family.empty()
    restored.loads(tmp_path)
    faults.assert_same_state(restored, family.build(4))
    rb.dumps(tmp_path)
