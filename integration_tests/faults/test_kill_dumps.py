"""SIGKILL at every step and at random moments of ``ReplayBuffer.dumps``; concurrent saves.

Processes are forked from the test (torch is imported once), so many trials stay cheap. After
every kill the checkpoint directory must load, equal a version that was really saved (the
last one reported, or the one being committed when the kill came), lose no row, keep the
user's entries named like snapshots, and record as its own every snapshot it left behind.
"""

from __future__ import annotations

import os
import pickle
import random
import shutil
import signal
import time

import pytest
import torch

from tdreplay.core import ReplayBuffer
from tdreplay.core.checkpoint import POINTER_NAME

# ---- kill at each step of a save --------------------------------------------------------------
#: what a save does that can be interrupted: file writes of the components, fsyncs, renames,
#: removals. The child dies just before or just after the k-th of these calls.
STEPS = [(os, "fsync"), (os, "replace"), (shutil, "rmtree"), (torch, "save"), (pickle, "dump")]


def _kill_at_step(path, family, k, after, names, done):
    """Save version 0, advance to version 1, and die at step ``k`` of saving it (k = 0: save
    normally and report the steps in ``names``)."""
    rb = family.build(0)
    rb.dumps(path)
    family.advance(rb, 1)
    seen: list[str] = []

    def wrap(module, attr):
        original = getattr(module, attr)

        def step(*args, **kwargs):
            label = attr
            if attr == "replace":
                label += ":" + os.path.basename(str(args[1]))
            seen.append(label)
            hit = len(seen) == k
            if hit and not after:
                os.kill(os.getpid(), signal.SIGKILL)
            out = original(*args, **kwargs)
            if hit:
                os.kill(os.getpid(), signal.SIGKILL)
            return out

        setattr(module, attr, step)

    for module, attr in STEPS:
        wrap(module, attr)
    rb.dumps(path)
    names.extend(seen)  # only reached when not killed (k = 0)
    done.value = 1


def phase_of(steps: list[str], k: int) -> int:
    """How many times the pointer was replaced before step ``k`` (1-based) of a save: 0 before
    the new snapshot is recorded, 1 while it is written, 2 once committed, 3 once cleaned up."""
    return steps[: k - 1].count(f"replace:{POINTER_NAME}")


def kill_points(steps: list[str]) -> list[int]:
    """The steps (1-based) to die at: every replace of the pointer, and the first and last
    step of each kind (fsync, replace of a file, rmtree, torch.save, pickle.dump) within each
    phase of the save. Repeats of one kind of step in one phase (one fsync per file written)
    leave the checkpoint in the same state as their first and last, so they are left out."""
    first_last: dict[tuple[str, int], list[int]] = {}
    for k, step in enumerate(steps, start=1):
        first_last.setdefault((step, phase_of(steps, k)), [k, k])[1] = k
    chosen = {k for ks in first_last.values() for k in ks}
    chosen |= {k for k, step in enumerate(steps, start=1) if step == f"replace:{POINTER_NAME}"}
    return sorted(chosen)


def test_kill_at_every_step_of_dumps(tmp_path, faults, tally):
    ctx = faults.fork_context()
    family = faults.Family(offset=0)

    # a dry run lists the steps of one save
    manager_names = ctx.Manager().list()
    done = ctx.RawValue("q", 0)
    p = ctx.Process(target=_kill_at_step, args=(tmp_path / "dry", family, 0, False,
                                                manager_names, done))
    p.start()
    p.join(60)
    steps = list(manager_names)
    assert p.exitcode == 0 and done.value == 1
    commits = [i for i, s in enumerate(steps, start=1) if s == f"replace:{POINTER_NAME}"]
    # the pointer is replaced three times: new snapshot recorded, commit, old ones forgotten
    assert len(commits) == 3, steps
    commit = commits[1]
    assert len(steps) >= 15, steps

    trials = 0
    points = kill_points(steps)
    # every kind of step in every phase of the commit protocol is killed, before and after
    assert {(s, phase_of(steps, k)) for k, s in enumerate(steps, start=1)} == \
        {(steps[k - 1], phase_of(steps, k)) for k in points}
    for k in points:
        for after in (False, True):
            path = tmp_path / f"k{k}-{int(after)}"
            faults.plant_decoys(path)
            done = ctx.RawValue("q", 0)
            p = ctx.Process(target=_kill_at_step, args=(path, family, k, after, [], done))
            p.start()
            p.join(60)
            assert p.exitcode == -signal.SIGKILL, (k, after, steps[k - 1])
            trials += 1

            restored = family.empty()
            restored.loads(path)
            committed = k > commit or (k == commit and after)
            version = family.version_of(restored)
            assert version == int(committed), (k, after, steps[k - 1])
            expected = family.build(version)
            lost = faults.rows_lost(restored, expected)
            tally.rows_lost += lost
            faults.assert_same_state(restored, expected)
            faults.assert_owned_layout(path, settled=False)

            # the next save commits and removes what the killed one left, and only that
            family.advance(restored, version + 1)
            restored.dumps(path)
            faults.assert_owned_layout(path, settled=True)
            again = family.empty()
            again.loads(path)
            faults.assert_same_state(again, family.build(version + 1))
    tally.injected("SIGKILL at a step of dumps", trials)
    assert trials == 2 * len(points)


# ---- kill at random moments of a save loop -----------------------------------------------------
def _save_loop(path, family, saved):
    """Restore the checkpoint (if any) and go on saving new versions until killed."""
    rb = family.empty()
    version = -1
    if (path / POINTER_NAME).exists():
        rb.loads(path)
        version = family.version_of(rb)
    while True:
        version += 1
        family.advance(rb, version)
        rb.dumps(path)
        saved.value = version


@pytest.mark.parametrize("tensordict", [False, True])
def test_kill_at_random_moments(tmp_path, faults, tally, tensordict):
    ctx = faults.fork_context()
    family = faults.Family(offset=100, tensordict=tensordict)
    rng = random.Random(18 + tensordict)
    path = tmp_path / "ckpt"
    faults.plant_decoys(path)
    last = -1
    trials = 20
    for trial in range(trials):
        saved = ctx.RawValue("q", last)
        p = ctx.Process(target=_save_loop, args=(path, family, saved))
        p.start()
        deadline = time.monotonic() + 60
        while saved.value == last:  # at least one save of this run, then a random moment
            assert p.is_alive() and time.monotonic() < deadline, "the save loop did not save"
            time.sleep(0.005)
        time.sleep(rng.uniform(0.0, 0.15))
        faults.sigkill(p)
        assert p.exitcode == -signal.SIGKILL
        reported = saved.value

        restored = family.empty()
        restored.loads(path)
        version = family.version_of(restored)
        # the last reported save, or the next one (committed, killed before reporting it):
        # never an older one (no committed save is lost), never a half-written one
        assert version in (reported, reported + 1), (trial, reported, version)
        expected = family.build(version)
        lost = faults.rows_lost(restored, expected)
        tally.rows_lost += lost
        assert lost == 0
        faults.assert_same_state(restored, family.build(version))
        faults.assert_owned_layout(path, settled=False)
        last = version
    tally.injected("SIGKILL at a random moment of a save loop", trials)


# ---- concurrent saves ---------------------------------------------------------------------------
def _save_versions(path, family, versions):
    rb = family.empty()
    for version in range(versions):
        family.advance(rb, version)
        rb.dumps(path)


def _read_loop(path, families, stop, loads, failures, first_failure):
    """Load the checkpoint again and again while others save to it: every load must work
    and give a version that was saved."""
    while not stop.value:
        rb = families[0].empty()
        try:
            rb.loads(path)
            values = [float(v) for v in rb.storage.items()]
            family = next(f for f in families if f.offset == int(values[0]) // 1000 * 1000)
            reference = family.build(family.version_of(rb))
            if values != [float(v) for v in reference.storage.items()]:
                raise AssertionError(f"loaded {values}, not a saved version")
        except Exception as err:  # noqa: BLE001 - counted and reported, the test fails on any
            if not failures.value:
                first_failure.value = repr(err)[:400].encode()
            failures.value += 1
        loads.value += 1


def test_concurrent_dumps_leave_the_last_committed_checkpoint(tmp_path, faults, tally):
    ctx = faults.fork_context()
    path = tmp_path / "ckpt"
    faults.plant_decoys(path)
    families = [faults.Family(offset=1000 * (p + 1)) for p in range(4)]
    versions = 6
    families[0].build(0).dumps(path)  # readers start on a checkpoint
    stop, loads, failures = (ctx.RawValue("q", 0) for _ in range(3))
    first_failure = ctx.RawArray("c", 401)
    # a fifth writer is killed in the middle of its saves
    victim_family = faults.Family(offset=9000)
    reader = ctx.Process(target=_read_loop, args=(path, [*families, victim_family], stop, loads,
                                                  failures, first_failure))
    writers = [ctx.Process(target=_save_versions, args=(path, f, versions)) for f in families]
    victim = ctx.Process(target=_save_versions, args=(path, victim_family, 10_000))
    reader.start()
    for w in writers:
        w.start()
    victim.start()
    time.sleep(random.Random(5).uniform(0.2, 0.6))
    faults.sigkill(victim)
    for w in writers:
        w.join(120)
    stop.value = 1
    reader.join(60)
    assert [w.exitcode for w in writers] == [0] * len(writers)
    assert victim.exitcode == -signal.SIGKILL
    assert reader.exitcode == 0 and loads.value > 0
    assert failures.value == 0, first_failure.value.decode()
    tally.injected("concurrent dumps", len(writers) * versions)
    tally.injected("SIGKILL of one of several concurrent writers")

    restored = families[0].empty()
    restored.loads(path)
    offset = int(faults.row_values(restored)[0]) // 1000 * 1000
    if offset == victim_family.offset:  # the victim committed last, before it was killed
        family = victim_family
        version = family.version_of(restored)
    else:  # otherwise the last commit is the last save of a writer that ran to the end
        family = next(f for f in families if f.offset == offset)
        version = versions - 1
        assert family.version_of(restored) == version
    lost = faults.rows_lost(restored, family.build(version))
    tally.rows_lost += lost
    faults.assert_same_state(restored, family.build(version))
    faults.assert_owned_layout(path, settled=False)
    ReplayBuffer.dumps(restored, path)
    faults.assert_owned_layout(path, settled=True)
