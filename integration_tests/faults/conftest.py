"""Helpers of the fault-injection suite (``integration_tests/faults``), shared as fixtures.

The suite kills, starves and damages what ``tdreplay-core`` writes, then checks that what is
left loads, equals a state that was really saved, and that nothing was lost. It uses core's
buffers and components only (``ListStorage``, ``RandomSampler``, ``RoundRobinWriter``), so it
does not depend on the other packages' refactors; ``test_checkpoint_crash.py`` covers the
memmap and flat storage checkpointers the same way. ``test_kill_memmap_extend.py`` kills
writers of a shared ``LazyMemmapStorage`` (no half-written row may count, no whole row be
lost) and ``test_storage_files.py`` fills the disk under the tensor checkpointers and a memmap
storage's first write, and damages every file of converted datasets and their Minari sources.
``test_refused_values.py`` feeds overflowing priorities, lossy casts, meta-device data and
states of bigger tensor-storage buffers, which must change nothing. Killed processes are forked
from the test process (no interpreter start-up per kill).

Versions: a *family* of buffers grows by ``STEP`` rows per version (a deterministic function
of the version and the family), samples once per version (so the generator state moves), and
wraps around its capacity. ``family.build(v)`` rebuilds version ``v`` from scratch, so any
restored buffer can be compared with what was saved.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import (
    ListStorage,
    RandomSampler,
    ReplayBuffer,
    RoundRobinWriter,
    TensorDictReplayBuffer,
)
from tdreplay.core.checkpoint import LOCK_NAME, POINTER_NAME, SNAPSHOT_PREFIX

STEP = 5
CAPACITY = 16

#: user entries named like snapshots, placed in checkpoint directories: they must survive
DECOYS = ("snapshot-000000-aaaaaaaa", "snapshot-000003-bbbbbbbb")


@dataclass(frozen=True)
class Family:
    """Deterministic versions of one buffer (``tensordict``: a TensorDictReplayBuffer)."""

    offset: int = 0
    tensordict: bool = False
    capacity: int = CAPACITY

    def empty(self) -> ReplayBuffer:
        kwargs: dict[str, Any] = dict(storage=ListStorage(self.capacity), sampler=RandomSampler(),
                                      writer=RoundRobinWriter(), batch_size=3,
                                      generator=torch.Generator().manual_seed(self.offset))
        return TensorDictReplayBuffer(**kwargs) if self.tensordict else ReplayBuffer(**kwargs)

    def rows(self, version: int) -> Any:
        start = self.offset + version * STEP
        values = torch.arange(start, start + STEP)
        if self.tensordict:
            return TensorDict({"obs": values.float().unsqueeze(-1).expand(STEP, 3).clone(),
                               "i": values}, [STEP])
        return [torch.tensor(float(v)) for v in values]

    def advance(self, rb: ReplayBuffer, version: int) -> None:
        rb.extend(self.rows(version))
        rb.sample()

    def build(self, version: int) -> ReplayBuffer:
        rb = self.empty()
        for v in range(version + 1):
            self.advance(rb, v)
        return rb

    def version_of(self, rb: ReplayBuffer) -> int:
        assert rb.write_count % STEP == 0, rb.write_count
        return rb.write_count // STEP - 1


def row_values(rb: ReplayBuffer) -> list[float]:
    """The stored rows in storage order, as numbers (the ``i`` entry of TensorDict rows)."""
    out = []
    for item in rb.storage.items():
        out.append(float(item["i"]) if isinstance(item, TensorDict) else float(item))
    return out


def rows_lost(restored: ReplayBuffer, expected: ReplayBuffer) -> int:
    """Rows of ``expected`` that ``restored`` lacks or holds with other values."""
    have, want = row_values(restored), row_values(expected)
    lost = sum(1 for i, v in enumerate(want) if i >= len(have) or have[i] != v)
    if isinstance(restored, TensorDictReplayBuffer):
        for a, b in zip(restored.storage.items(), expected.storage.items()):
            lost += int(not torch.equal(a["obs"], b["obs"]))
    return lost


def assert_same_state(restored: ReplayBuffer, expected: ReplayBuffer) -> None:
    """Same rows, counters and generator: the restored buffer goes on as the saved one."""
    assert rows_lost(restored, expected) == 0
    assert len(restored) == len(expected)
    assert restored.writer.state_dict() == expected.writer.state_dict()
    a, b = restored.state_dict()["_rng"], expected.state_dict()["_rng"]
    assert torch.equal(a, b)
    for _ in range(3):
        x, y = restored.sample(), expected.sample()
        if isinstance(x, TensorDict):
            assert torch.equal(x["i"], y["i"])
        else:
            assert torch.equal(x, y)
    # put the generators back: the buffers go on as if this check had not sampled
    restored.sampler.generator.set_state(a)
    expected.sampler.generator.set_state(b)


def buffer_fingerprint(rb: ReplayBuffer) -> tuple:
    """Everything a refused call must leave as it was."""
    state = rb.state_dict()
    return (row_values(rb), rb.write_count, tuple(sorted(rb.writer.state_dict().items())),
            state["_rng"].clone() if "_rng" in state else None)


def assert_unchanged(rb: ReplayBuffer, before: tuple) -> None:
    after = buffer_fingerprint(rb)
    assert after[:3] == before[:3]
    assert (after[3] is None and before[3] is None) or torch.equal(after[3], before[3])


def pointer(path: Path) -> dict[str, Any]:
    return json.loads((path / POINTER_NAME).read_text())


def snapshot_dirs(path: Path) -> set[str]:
    return {p.name for p in path.iterdir() if p.name.startswith(SNAPSHOT_PREFIX)}


def plant_decoys(path: Path) -> None:
    """A user's entries named like snapshots (a folder with a file, and a file)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / DECOYS[0]).mkdir(exist_ok=True)
    (path / DECOYS[0] / "mine.txt").write_text("user data")
    (path / DECOYS[1]).write_text("user file")


def assert_owned_layout(path: Path, *, settled: bool) -> None:
    """Decoys intact; every other snapshot directory is recorded in the pointer (the format
    owns it); once ``settled`` (after a completed save) only the current one is left."""
    assert (path / DECOYS[0] / "mine.txt").read_text() == "user data"
    assert (path / DECOYS[1]).read_text() == "user file"
    meta = pointer(path)
    ours = snapshot_dirs(path) - set(DECOYS)
    assert ours <= set(meta["snapshots"]), (ours, meta)
    if settled:
        assert ours == {meta["snapshot"]} and meta["snapshots"] == [meta["snapshot"]]
        extra = {p.name for p in path.iterdir()} - ours - set(DECOYS)
        assert extra == {POINTER_NAME, LOCK_NAME}, extra


def fork_context() -> Any:
    if not hasattr(signal, "SIGKILL") or "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("needs POSIX signals and fork")
    return multiprocessing.get_context("fork")


def sigkill(process: Any) -> None:
    """SIGKILL ``process`` (a multiprocessing.Process) and reap it."""
    try:
        os.kill(process.pid, signal.SIGKILL)
    except ProcessLookupError:  # already gone
        pass
    process.join(30)


class Helpers:
    """The helpers above, handed to tests by the ``faults`` fixture."""

    STEP = STEP
    CAPACITY = CAPACITY
    DECOYS = DECOYS
    Family = Family
    row_values = staticmethod(row_values)
    rows_lost = staticmethod(rows_lost)
    assert_same_state = staticmethod(assert_same_state)
    buffer_fingerprint = staticmethod(buffer_fingerprint)
    assert_unchanged = staticmethod(assert_unchanged)
    pointer = staticmethod(pointer)
    snapshot_dirs = staticmethod(snapshot_dirs)
    plant_decoys = staticmethod(plant_decoys)
    assert_owned_layout = staticmethod(assert_owned_layout)
    fork_context = staticmethod(fork_context)
    sigkill = staticmethod(sigkill)


@pytest.fixture
def small_disk(tmp_path: Path, request: Any) -> Iterator[Path]:
    """A tmpfs of the test module's ``SIZE`` bytes mounted under ``tmp_path`` (a full disk
    within reach); skipped where mounting needs what the machine lacks (root, mount(8))."""
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    size = request.module.SIZE
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


@pytest.fixture
def faults() -> type[Helpers]:
    """The suite's helpers (see the module docstring)."""
    return Helpers


class FaultTally:
    """Faults injected and rows lost, summed over the suite and printed at its end."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.rows_lost = 0

    def injected(self, kind: str, n: int = 1) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + n


_TALLY = FaultTally()


@pytest.fixture
def tally() -> FaultTally:
    """Count the faults a test injects (``tally.injected(kind)``) and the rows it found lost."""
    return _TALLY


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _TALLY.counts:
        total = sum(_TALLY.counts.values())
        kinds = ", ".join(f"{k}: {n}" for k, n in sorted(_TALLY.counts.items()))
        terminalreporter.write_line(
            f"fault injection: {total} faults injected ({kinds}); rows lost: {_TALLY.rows_lost}")
