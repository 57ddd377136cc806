"""Collector processes that attach to a buffer by name, a learner sampling it meanwhile."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import torch
from distributed_workers import make_batch, rows_are_intact, run_collector

from tdreplay.distributed import RayReplayBuffer

NAMESPACE = "tdreplay-tests"  # conftest.RAY_NAMESPACE
START_TIMEOUT = 240.0  # a spawned process imports torch and joins Ray: slow on a busy machine


def _spawn_collector(ray_session, collector: int, batches: int, size: int, pause: float = 0.0):
    ctx = multiprocessing.get_context("spawn")
    acked = ctx.Value("l", 0)
    address = ray_session.get_runtime_context().gcs_address
    process = ctx.Process(target=run_collector, daemon=True,
                          args=(address, NAMESPACE, "shared-td", collector, batches, size, acked,
                                pause))
    process.start()
    return process, acked


def _wait_until(condition, what: str, timeout: float = START_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _batches_by_collector(data) -> dict[int, dict[int, list[int]]]:
    """{collector: {seq: sorted rows}} of the stored rows."""
    out: dict[int, dict[int, list[int]]] = {}
    for c, s, r in zip(data["collector"].tolist(), data["seq"].tolist(), data["row"].tolist()):
        out.setdefault(c, {}).setdefault(s, []).append(r)
    return {c: {s: sorted(rows) for s, rows in seqs.items()} for c, seqs in out.items()}


def test_two_collector_processes_and_a_learner_share_one_buffer(shared_td, ray_session):
    batches, size = 25, 16
    collectors = [_spawn_collector(ray_session, c, batches, size) for c in (1, 2)]
    samples = 0
    learner = RayReplayBuffer.attach("shared-td")
    try:
        _wait_until(lambda: len(learner) > 0, "a first write")
        while any(p.is_alive() for p, _ in collectors) or samples < 5:
            data = learner.sample()
            assert data.batch_size == torch.Size([32])
            assert rows_are_intact(data)  # no row half-written or mixed with another
            assert set(data["collector"].tolist()) <= {1, 2}
            samples += 1
        for process, acked in collectors:
            process.join(timeout=60)
            assert process.exitcode == 0
            assert acked.value == batches
    finally:
        for process, _ in collectors:
            if process.is_alive():
                process.kill()
    assert samples >= 5
    assert len(shared_td) == shared_td.write_count == 2 * batches * size
    stored = _batches_by_collector(shared_td[:])
    assert stored == {c: {s: list(range(size)) for s in range(batches)} for c in (1, 2)}


def test_a_collector_that_dies_mid_stream_loses_only_its_unsent_batch(shared_td, ray_session):
    size = 8
    victim, acked = _spawn_collector(ray_session, 1, 100_000, size, pause=0.005)
    try:
        _wait_until(lambda: acked.value >= 3, "the victim's first batches")
        for seq in range(5):  # this process collects meanwhile
            shared_td.extend(make_batch(0, seq, size))
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(timeout=60)
    finally:
        if victim.is_alive():
            victim.kill()
    assert victim.exitcode == -signal.SIGKILL
    sent = acked.value
    for seq in range(5, 10):  # the buffer goes on serving the others
        shared_td.extend(make_batch(0, seq, size))

    stored_rows = len(shared_td)
    assert stored_rows < 20_000  # nothing overwritten: every batch written is still there
    stored = _batches_by_collector(shared_td[:])
    assert stored[0] == {s: list(range(size)) for s in range(10)}
    victim_batches = stored.get(1, {})
    # every acknowledged batch is there whole; the one in flight is there whole or not at all
    assert sorted(victim_batches) in (list(range(sent)), list(range(sent + 1)))
    assert all(rows == list(range(size)) for rows in victim_batches.values())
    assert stored_rows == shared_td.write_count == size * (10 + len(victim_batches))
