"""A process killed (SIGKILL) in the middle of ``ReplayBuffer.dumps`` never costs a checkpoint.

A child process fills a buffer, saves it (version 1), writes more, and is killed at a chosen
point of the second save: while storage files are written, once the storage is complete,
after the pointer file is replaced by the commit. The test then checks that the checkpoint
directory loads exactly one complete version (version 1 before the commit point, version 2
after it), that no half-written snapshot is ever what loads, that the next save cleans up what
the format wrote and nothing else (a user's entries named like snapshots survive). A last test
kills a process that saves in a loop at random moments. (The storage-agnostic steps of a save
are killed one by one, many more times, in test_kill_dumps.py.)

The children are forked from the test process (torch, tensordict and tdreplay are imported
once, no interpreter starts per kill); each patches the step it dies at in its own memory only.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from tensordict import TensorDict

import tdreplay.core.checkpoint as checkpoint
import tdreplay.storages._file_writes as file_writes
import tdreplay.storages.checkpointers as checkpointers
from tdreplay.core import ReplayBuffer, SamplerWithoutReplacement
from tdreplay.core.checkpoint import MANIFEST_NAME, POINTER_NAME, verify_checkpoint
from tdreplay.storages import FlatStorageCheckpointer, LazyMemmapStorage, LazyTensorStorage

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX signals")

CAPACITY = 64
CHUNK = 24


def chunk(version: int) -> TensorDict:
    i = torch.arange(version * CHUNK, version * CHUNK + CHUNK)
    return TensorDict({
        "obs": i.float().unsqueeze(-1).expand(CHUNK, 8).clone(),
        ("next", "obs"): (i + 1).float().unsqueeze(-1).expand(CHUNK, 8).clone(),
        ("next", "done"): (i % 7 == 6).unsqueeze(-1),
        "i": i,
    }, [CHUNK])


def make(kind: str, scratch: str) -> ReplayBuffer:
    if kind == "memmap":
        storage: Any = LazyMemmapStorage(CAPACITY, scratch_dir=scratch)
    else:
        storage = LazyTensorStorage(CAPACITY, checkpointer=FlatStorageCheckpointer())
    return ReplayBuffer(storage=storage, sampler=SamplerWithoutReplacement(), batch_size=8,
                        generator=torch.Generator().manual_seed(0))


def advance(rb: ReplayBuffer, version: int) -> None:
    """Version v: v + 1 chunks written, one batch sampled after each."""
    rb.extend(chunk(version))
    rb.sample()


def _die(*args: Any, **kwargs: Any) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _kill_at(module: Any, name: str, calls: int = 1, when: Any = None,
             after: bool = False) -> None:
    """Die at the ``calls``-th call of ``module.name`` that ``when`` accepts: as it starts, or
    right ``after`` it returns (patched in the forked child only)."""
    original = getattr(module, name)
    count = [0]

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        hit = when is None or when(*args, **kwargs)
        if hit:
            count[0] += 1
            hit = count[0] == calls
        if hit and not after:
            _die()
        out = original(*args, **kwargs)
        if hit:
            _die()
        return out

    setattr(module, name, wrapper)


def _replaces_pointer(src: Any, dst: Any) -> bool:
    return os.path.basename(dst) == POINTER_NAME


def _crash_child(kind: str, scratch: str, path: str, kill_point: str, saved: Any) -> None:
    rb = make(kind, scratch)
    advance(rb, 0)
    rb.dumps(path)                      # version 0: complete
    advance(rb, 1)                      # version 1 lives only in memory until the next save
    saved.value = 0
    if kill_point == "storage_files":   # some of the storage's array files are written
        if kind == "memmap":
            # the second leaf file of the tensor checkpointer's data (written with pwrite)
            _kill_at(file_writes, "_write_all", calls=2)
        else:
            _kill_at(checkpointers, "_to_numpy", calls=3)
    elif kill_point == "storage_done":  # storage complete, sampler and writer not written
        _kill_at(rb.sampler, "dumps")
    elif kill_point == "after_pointer":   # pointer replaced, old snapshot not yet removed
        _kill_at(checkpoint.os, "replace", calls=2, after=True, when=_replaces_pointer)
    rb.dumps(path)
    saved.value = 1


def _save_loop(kind: str, scratch: str, path: str, saved: Any) -> None:
    rb = make(kind, scratch)
    version = 0
    while True:
        advance(rb, version)
        rb.dumps(path)
        saved.value = version
        version += 1


def reference(kind: str, scratch: Path, version: int) -> ReplayBuffer:
    """The buffer as it was when version ``version`` was saved."""
    rb = make(kind, str(scratch))
    for v in range(version + 1):
        advance(rb, v)
    return rb

def assert_same_buffer(restored: ReplayBuffer, expected: ReplayBuffer) -> None:
    assert len(restored) == len(expected)
    assert restored.write_count == expected.write_count
    assert restored.writer.state_dict() == expected.writer.state_dict()
    assert (restored[:] == expected[:]).all()
    a, b = restored.sampler.state_dict(), expected.sampler.state_dict()
    assert a["pos"] == b["pos"] and torch.equal(a["perm"], b["perm"])
    # and it goes on drawing the same batches
    for _ in range(4):
        assert torch.equal(restored.sample()["i"], expected.sample()["i"])


@pytest.mark.parametrize(
    ("kind", "kill_point", "survivor", "n_leftovers"),
    [
        # memmap storage + TensorStorageCheckpointer (TensorDict memmap files) and the flat
        # storage checkpointer (raw files of its own) while their files are written, and around
        # the commit. The other steps of the commit protocol (record, manifest, pointer) do not
        # depend on the storage: test_kill_dumps.py kills each of them, before and after.
        ("memmap", "storage_files", 0, 1),
        ("flat", "storage_files", 0, 1),
        ("memmap", "storage_done", 0, 1),
        ("flat", "storage_done", 0, 1),
        ("memmap", "after_pointer", 1, 1),
        ("flat", "after_pointer", 1, 1),
    ],
)
def test_kill_during_dumps_keeps_a_complete_checkpoint(tmp_path, faults, tally, kind, kill_point,
                                                       survivor, n_leftovers):
    path = tmp_path / "ckpt"
    faults.plant_decoys(path)  # a user's entries named like snapshots: they must survive
    ctx = faults.fork_context()
    saved = ctx.RawValue("q", -1)
    child = ctx.Process(target=_crash_child, args=(kind, str(tmp_path / "child-scratch"),
                                                   str(path), kill_point, saved))
    child.start()
    child.join(120)
    assert child.exitcode == -signal.SIGKILL and saved.value == 0, (child.exitcode, saved.value)
    tally.injected(f"SIGKILL at a named point of dumps ({kind} storage)")

    # the pointer names one complete snapshot: the old one before the commit, the new one after
    snap = verify_checkpoint(path)
    pointer = json.loads((path / POINTER_NAME).read_text())
    assert snap.name == pointer["snapshot"] and (snap / MANIFEST_NAME).is_file()
    leftovers = sorted(faults.snapshot_dirs(path) - set(faults.DECOYS) - {snap.name})
    faults.assert_owned_layout(path, settled=False)
    # the crashed save's snapshot (new or old) is still there, recorded as the format's own
    assert len(leftovers) == n_leftovers
    assert set(leftovers) <= set(pointer["snapshots"])
    if kill_point in ("storage_files", "storage_done", "before_manifest") and leftovers:
        # unfinished: without a manifest, nothing could load it even if pointed to
        assert not (path / leftovers[0] / MANIFEST_NAME).exists()

    restored = make(kind, str(tmp_path / "restored-scratch"))
    restored.loads(path)
    assert_same_buffer(restored, reference(kind, tmp_path / "reference-scratch", survivor))

    # the next save commits and clears what the crash left behind
    restored.dumps(path)
    faults.assert_owned_layout(path, settled=True)  # no .tmp either
    again = make(kind, str(tmp_path / "again-scratch"))
    again.loads(path)
    assert len(again) == len(restored) and again.write_count == restored.write_count


def test_kill_at_random_moments_of_a_save_loop(tmp_path, faults, tally):
    kind = "memmap"
    rng = random.Random(1234)
    path = tmp_path / "ckpt"
    faults.plant_decoys(path)
    ctx = faults.fork_context()
    for attempt in range(6):
        saved = ctx.RawValue("q", -1)
        proc = ctx.Process(target=_save_loop, args=(kind, str(tmp_path / f"scratch{attempt}"),
                                                    str(path), saved))
        proc.start()
        # wait for a first complete save of this run, then kill at a random moment
        deadline = time.monotonic() + 60
        while saved.value < 0:
            assert proc.is_alive() and time.monotonic() < deadline, "the save loop did not save"
            time.sleep(0.005)
        time.sleep(rng.uniform(0.0, 0.3))
        faults.sigkill(proc)
        assert proc.exitcode == -signal.SIGKILL
        tally.injected("SIGKILL at a random moment of a save loop (memmap storage)")
        last_saved = saved.value

        restored = make(kind, str(tmp_path / f"restored{attempt}"))
        restored.loads(path)
        # the checkpoint is the last reported save or the one after it (committed just before
        # the kill, not yet reported), never anything in between
        version = restored.write_count // CHUNK - 1
        assert restored.write_count % CHUNK == 0 and version in (last_saved, last_saved + 1)
        assert_same_buffer(restored, reference(kind, tmp_path / f"reference{attempt}", version))
        faults.assert_owned_layout(path, settled=False)
