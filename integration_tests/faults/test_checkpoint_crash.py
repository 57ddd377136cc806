"""A process killed (SIGKILL) in the middle of ``ReplayBuffer.dumps`` never costs a checkpoint.

A child process fills a buffer, saves it (version 1), writes more, and is killed at a chosen
point of the second save: once the new snapshot is recorded in the pointer, while storage
files are written, before the manifest, before and after the pointer file is replaced by the
commit. The test then checks that the checkpoint directory loads
exactly one complete version (version 1 before the commit point, version 2 after it), that no
half-written snapshot is ever what loads, that the next save cleans up what the format wrote
and nothing else (a user's entries named like snapshots survive). A last test kills a process
that saves in a loop at random moments from outside. (The storage-agnostic steps of a save are
killed one by one, many more times, in test_kill_dumps.py.)
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from tdreplay.core import ReplayBuffer
from tdreplay.core.checkpoint import MANIFEST_NAME, POINTER_NAME, verify_checkpoint

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX signals")

CAPACITY = 64

# Shared by the child process and the test: how each version of the buffer is built.
BUILD = textwrap.dedent(
    '''
    import torch
    from tensordict import TensorDict
    from tdreplay.core import ReplayBuffer
    from tdreplay.samplers import SamplerWithoutReplacement
    from tdreplay.storages import FlatStorageCheckpointer, LazyMemmapStorage, LazyTensorStorage

    CAPACITY = 64

    def chunk(version: int) -> TensorDict:
        i = torch.arange(version * 24, version * 24 + 24)
        return TensorDict({
            "obs": i.float().unsqueeze(-1).expand(24, 8).clone(),
            ("next", "obs"): (i + 1).float().unsqueeze(-1).expand(24, 8).clone(),
            ("next", "done"): (i % 7 == 6).unsqueeze(-1),
            "i": i,
        }, [24])

    def make(kind: str, scratch: str) -> ReplayBuffer:
        if kind == "memmap":
            storage = LazyMemmapStorage(CAPACITY, scratch_dir=scratch)
        else:
            storage = LazyTensorStorage(CAPACITY, checkpointer=FlatStorageCheckpointer())
        return ReplayBuffer(storage=storage, sampler=SamplerWithoutReplacement(), batch_size=8,
                            generator=torch.Generator().manual_seed(0))

    def advance(rb: ReplayBuffer, version: int) -> None:
        """Version v: v + 1 chunks written, one batch sampled after each."""
        rb.extend(chunk(version))
        rb.sample()
    '''
)

CHILD = BUILD + textwrap.dedent(
    '''
    import os, signal, sys
    import tdreplay.core.checkpoint as checkpoint
    import tdreplay.storages.checkpointers as checkpointers
    import tdreplay.storages._file_writes as file_writes

    kind, scratch, path, kill_point = sys.argv[1:5]

    def die(*args, **kwargs):
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    def kill_at(module, name, calls=1, when=lambda *a, **k: True, after=False):
        """Die at the ``calls``-th call of ``module.name`` that ``when`` accepts: as it starts,
        or right ``after`` it returns."""
        original = getattr(module, name)
        count = [0]

        def wrapper(*args, **kwargs):
            hit = when(*args, **kwargs)
            if hit:
                count[0] += 1
                hit = count[0] == calls
            if hit and not after:
                die()
            out = original(*args, **kwargs)
            if hit:
                die()
            return out

        setattr(module, name, wrapper)

    rb = make(kind, scratch)
    advance(rb, 0)
    rb.dumps(path)                      # version 0: complete
    advance(rb, 1)                      # version 1 lives only in memory until the next save
    print("saved 0", flush=True)

    def replaces_pointer(src, dst):
        return os.path.basename(dst) == checkpoint.POINTER_NAME

    if kill_point == "after_record":    # new snapshot recorded as the format's, not yet created
        kill_at(checkpoint.os, "replace", calls=1, after=True, when=replaces_pointer)
    elif kill_point == "storage_files":   # some of the storage's array files are written
        if kind == "memmap":
            # the second leaf file of the tensor checkpointer's data (written with pwrite)
            kill_at(file_writes, "_write_all", calls=2)
        else:
            kill_at(checkpointers, "_to_numpy", calls=3)
    elif kill_point == "storage_done":  # storage complete, sampler and writer not written
        kill_at(rb.sampler, "dumps")
    elif kill_point == "before_manifest":
        kill_at(checkpoint, "_crc32")
    elif kill_point == "before_pointer":  # manifest written, new pointer not yet in place
        # (the first replace of the pointer recorded the new snapshot, the second commits it)
        kill_at(checkpoint.os, "replace", calls=2, when=replaces_pointer)
    elif kill_point == "after_pointer":   # pointer replaced, old snapshot not yet removed
        kill_at(checkpoint.os, "replace", calls=2, after=True, when=replaces_pointer)
    rb.dumps(path)
    print("saved 1", flush=True)
    '''
)

LOOP_CHILD = BUILD + textwrap.dedent(
    '''
    import sys
    kind, scratch, path = sys.argv[1:4]
    rb = make(kind, scratch)
    version = 0
    while True:
        advance(rb, version)
        rb.dumps(path)
        print(f"saved {version}", flush=True)
        version += 1
    '''
)

namespace: dict = {}
exec(compile(BUILD, "<build>", "exec"), namespace)  # noqa: S102 - our own code, shared with the child
make, advance = namespace["make"], namespace["advance"]


def reference(kind: str, scratch: Path, version: int) -> ReplayBuffer:
    """The buffer as it was when version ``version`` was saved."""
    rb = make(kind, str(scratch))
    for v in range(version + 1):
        advance(rb, v)
    return rb


def run_child(code: str, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    script = Path(args[2]).parent / "child.py"
    script.write_text(code)
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True,
                          timeout=timeout, env=os.environ.copy())


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
        ("memmap", "after_pointer", 1, 1),
    ],
)
def test_kill_during_dumps_keeps_a_complete_checkpoint(tmp_path, faults, tally, kind, kill_point,
                                                       survivor, n_leftovers):
    path = tmp_path / "ckpt"
    faults.plant_decoys(path)  # a user's entries named like snapshots: they must survive
    proc = run_child(CHILD, kind, str(tmp_path / "child-scratch"), str(path), kill_point)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert "saved 0" in proc.stdout and "saved 1" not in proc.stdout
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
    script = tmp_path / "loop.py"
    script.write_text(LOOP_CHILD)
    last_saved = -1
    for attempt in range(3):
        proc = subprocess.Popen(
            [sys.executable, str(script), kind, str(tmp_path / f"scratch{attempt}"), str(path)],
            stdout=subprocess.PIPE, text=True, env=os.environ.copy(),
        )
        # wait for a first complete save of this run, then kill at a random moment
        line = proc.stdout.readline()
        assert line.startswith("saved"), line
        time.sleep(rng.uniform(0.0, 0.3))
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate(timeout=60)
        tally.injected("SIGKILL at a random moment of a save loop (memmap storage)")
        reported = [int(x.split()[1]) for x in (line + out).splitlines() if x.startswith("saved")]
        last_saved = max(reported)

        restored = make(kind, str(tmp_path / f"restored{attempt}"))
        restored.loads(path)
        # the checkpoint is the last reported save or the one after it (committed just before
        # the kill, not yet reported), never anything in between
        version = restored.write_count // 24 - 1
        assert restored.write_count % 24 == 0 and version in (last_saved, last_saved + 1)
        assert_same_buffer(restored, reference(kind, tmp_path / f"reference{attempt}", version))
        faults.assert_owned_layout(path, settled=False)
