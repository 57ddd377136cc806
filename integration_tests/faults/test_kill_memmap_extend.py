"""SIGKILL at random moments of ``LazyMemmapStorage`` writes; the reopened storage counts no
half-written row and loses no whole one.

A forked child extends a shared memmap buffer in a loop (first writes, a full ring, wraps round
the end; batches of a size that does not divide the capacity) and tells the parent, through
shared memory, which batch it is writing. The parent kills it at a random moment, reopens the
storage from its scratch directory and checks every counted row: its entries must agree (each
row carries its id in three leaves of different dtypes), every id must have been written, and
every batch that was complete before the one in flight must still be there unless the ring has
since evicted it (the rows counted are exactly the newest ones, oldest first from the cursor).
"""

from __future__ import annotations

import random
import signal
import time

import torch
from tensordict import TensorDict

from tdreplay.core import ReplayBuffer
from tdreplay.storages import LazyMemmapStorage

CAPACITY = 600
BATCH = 70  # does not divide CAPACITY: writes wrap round the end
WIDTH = 64
TRIALS = 40


def batch(version: int) -> TensorDict:
    ids = torch.arange(version * BATCH, (version + 1) * BATCH)
    return TensorDict({"a": ids.double().unsqueeze(-1).expand(BATCH, WIDTH).clone(), "id": ids,
                       ("next", "z"): (-ids).float().unsqueeze(-1).expand(BATCH, WIDTH).clone()},
                      [BATCH])


def _writer(path, progress) -> None:
    rb = ReplayBuffer(storage=LazyMemmapStorage(CAPACITY, scratch_dir=path, existsok=True),
                      batch_size=4)
    version = 0
    while True:
        progress.value = version  # the batch being written (complete: all before it)
        rb.extend(batch(version))
        version += 1


def check(path, last_complete: int) -> tuple[int, int]:
    """(torn rows counted, whole rows lost) of the storage in ``path``."""
    storage = LazyMemmapStorage(CAPACITY, scratch_dir=path, existsok=True)
    n = len(storage)
    if not n:
        return 0, max(0, min(CAPACITY, (last_complete + 1) * BATCH))
    td = storage[:n]
    ids = td["id"]
    whole = (td["a"] == ids.double().unsqueeze(-1)).all(-1) \
        & (td["next", "z"] == (-ids).float().unsqueeze(-1)).all(-1)
    torn = int((~whole).sum())
    # the newest complete rows must all be there: those of the batches before the one in
    # flight that the ring still holds after dropping (at most) one batch of torn rows
    written = (last_complete + 1) * BATCH
    must_keep = set(range(max(0, written - (CAPACITY - BATCH)), written))
    lost = len(must_keep - set(ids[whole].tolist()))
    return torn, lost


def test_sigkill_during_memmap_extend(tmp_path, faults, tally):
    ctx = faults.fork_context()
    rng = random.Random(18)
    torn_total = lost_total = kills = 0
    for trial in range(TRIALS):
        path = tmp_path / f"t{trial}"
        progress = ctx.Value("q", -1, lock=False)
        child = ctx.Process(target=_writer, args=(path, progress))
        child.start()
        # first writes early on, full rings and wraps later
        deadline = time.monotonic() + 30
        target = rng.randint(0, 30)
        while progress.value < target and child.is_alive() and time.monotonic() < deadline:
            time.sleep(0.0005)
        time.sleep(rng.uniform(0, 0.002))
        faults.sigkill(child)
        assert child.exitcode == -signal.SIGKILL
        kills += 1
        torn, lost = check(path, int(progress.value) - 1)
        torn_total += torn
        lost_total += lost
    tally.injected("SIGKILL during memmap extend", kills)
    tally.rows_lost += lost_total
    assert torn_total == 0, f"{torn_total} half-written rows counted as valid"
    assert lost_total == 0, f"{lost_total} whole rows lost"


def test_sigkill_during_in_place_edits(tmp_path, faults, tally):
    """Overwrites of single counted rows (``storage.set(row, ...)``) killed at random."""
    ctx = faults.fork_context()
    rng = random.Random(7)

    def editor(path, progress) -> None:
        storage = LazyMemmapStorage(CAPACITY, scratch_dir=path, existsok=True)
        version = 1
        while True:
            progress.value = version
            row = batch(version)[version % BATCH]
            storage.set(version % CAPACITY, row)
            version += 1

    torn_total = 0
    for trial in range(10):
        path = tmp_path / f"e{trial}"
        base = LazyMemmapStorage(CAPACITY, scratch_dir=path)
        for v in range(CAPACITY // BATCH + 1):
            base.set(slice(v * BATCH, min((v + 1) * BATCH, CAPACITY)),
                     batch(v)[: min(BATCH, CAPACITY - v * BATCH)])
        del base
        progress = ctx.Value("q", -1, lock=False)
        child = ctx.Process(target=editor, args=(path, progress))
        child.start()
        deadline = time.monotonic() + 30
        while progress.value < rng.randint(5, 200) and child.is_alive() \
                and time.monotonic() < deadline:
            time.sleep(0.0002)
        faults.sigkill(child)
        tally.injected("SIGKILL during memmap in-place edit")
        storage = LazyMemmapStorage(CAPACITY, scratch_dir=path, existsok=True)
        td = storage[: len(storage)]
        ids = td["id"]
        whole = (td["a"] == ids.double().unsqueeze(-1)).all(-1) \
            & (td["next", "z"] == (-ids).float().unsqueeze(-1)).all(-1)
        torn_total += int((~whole).sum())
        assert len(storage) >= CAPACITY - 1  # at most the one row being edited is dropped
    assert torn_total == 0
