"""A LazyMemmapStorage buffer handed to worker processes that extend it while the parent samples."""

from __future__ import annotations

import multiprocessing as mp
import time

import pytest
import torch
from tensordict import TensorDict, tensorclass

from tdreplay.core import ReplayBuffer
from tdreplay.storages import LazyMemmapStorage

WORKERS = 2
CHUNKS = 15
CHUNK = 20
STRIDE = 100_000  # worker w writes ids w * STRIDE + i


def chunk(worker: int, index: int) -> TensorDict:
    ids = worker * STRIDE + index * CHUNK + torch.arange(CHUNK)
    return TensorDict({"id": ids, "check": -ids.double(),
                       "block": ids.float().unsqueeze(-1).expand(CHUNK, 16).clone()}, [CHUNK])


def extend_worker(rb: ReplayBuffer, worker: int, sampled_event) -> None:
    for index in range(CHUNKS):
        if index == CHUNKS // 2:
            # half-way: wait until the parent has sampled rows written so far
            assert sampled_event.wait(120)
        rb.extend(chunk(worker, index))
        time.sleep(0.002)


def assert_rows_whole(batch: TensorDict) -> None:
    """Every sampled row is one written row, never a mix of two writes."""
    ids = batch["id"]
    assert torch.equal(batch["check"], -ids.double())
    assert torch.equal(batch["block"], ids.float().unsqueeze(-1).expand(-1, 16))


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_workers_extend_while_parent_samples(tmp_path, start_method):
    ctx = mp.get_context(start_method)
    capacity = 1000  # larger than everything written: every row stays
    rb = ReplayBuffer(storage=LazyMemmapStorage(capacity, scratch_dir=tmp_path), batch_size=32)
    sampled = ctx.Event()
    procs = [ctx.Process(target=extend_worker, args=(rb, w, sampled)) for w in range(WORKERS)]
    for p in procs:
        p.start()
    seen_lengths = []
    deadline = time.monotonic() + 240
    while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
        n = len(rb)
        seen_lengths.append(n)
        if n:
            assert_rows_whole(rb.sample())
            sampled.set()
        time.sleep(0.005)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    total = WORKERS * CHUNKS * CHUNK
    # the parent never wrote: layout, length, cursor and write count all come from the children
    assert len(rb) == total
    assert rb.write_count == total
    assert rb.writer.cursor == total
    # the parent sampled while the workers were writing
    assert any(0 < n < total for n in seen_lengths)
    assert seen_lengths == sorted(seen_lengths)  # len only grows
    assert all(n % CHUNK == 0 for n in seen_lengths)  # an extend is seen whole or not at all
    expected = sorted(w * STRIDE + i for w in range(WORKERS) for i in range(CHUNKS * CHUNK))
    assert sorted(rb[:]["id"].tolist()) == expected
    assert_rows_whole(rb[:])
    # each worker's chunks landed in order, in disjoint row blocks of CHUNK rows
    ids = rb[:]["id"].reshape(-1, CHUNK)
    assert torch.equal(ids - ids[:, :1], torch.arange(CHUNK).expand_as(ids))
    # the parent samples every row written by the children
    drawn = set(rb.sample(4 * total)["id"].tolist())
    assert drawn <= set(expected) and len(drawn) > total // 2


def parent_writes_then_child_reads(rb: ReplayBuffer, queue) -> None:
    queue.put((len(rb), rb.write_count, rb[:]["id"].tolist()))
    rb.extend(chunk(1, 0))
    queue.put(len(rb))


def test_child_sees_parent_rows_and_parent_sees_child_rows(tmp_path):
    # fork only: the spawn path (pickling the buffer) is covered above, and spawning is slow
    ctx = mp.get_context("fork")
    rb = ReplayBuffer(storage=LazyMemmapStorage(100, scratch_dir=tmp_path), batch_size=4)
    rb.extend(chunk(0, 0))
    queue = ctx.Queue()
    proc = ctx.Process(target=parent_writes_then_child_reads, args=(rb, queue))
    proc.start()
    length, write_count, ids = queue.get(timeout=120)
    assert (length, write_count) == (CHUNK, CHUNK)
    assert ids == chunk(0, 0)["id"].tolist()
    assert queue.get(timeout=120) == 2 * CHUNK
    proc.join(60)
    assert proc.exitcode == 0
    assert len(rb) == 2 * CHUNK and rb.writer.cursor == 2 * CHUNK
    assert rb[CHUNK:]["id"].tolist() == chunk(1, 0)["id"].tolist()


@tensorclass
class Step:
    """Tensorclass items (module level: importable where the layout file names it)."""

    obs: torch.Tensor
    step: torch.Tensor


def read_tensorclass_then_write(scratch_dir, queue) -> None:
    storage = LazyMemmapStorage(10, scratch_dir=scratch_dir, existsok=True)  # a new handle
    rb = ReplayBuffer(storage=storage)
    rows = rb[:]
    queue.put((type(rows).__name__, rows.step.tolist()))
    rb.extend(Step(obs=torch.ones(1, 2), step=torch.tensor([7]), batch_size=[1]))


def test_a_new_handle_in_another_process_reads_and_writes_tensorclass_items(tmp_path):
    # the layout file names the items' tensorclass: a process that opens the storage anew
    # reads Step items (it raised "structure unknown in this process") and writes more
    rb = ReplayBuffer(storage=LazyMemmapStorage(10, scratch_dir=tmp_path))
    rb.extend(Step(obs=torch.zeros(3, 2), step=torch.arange(3), batch_size=[3]))
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=read_tensorclass_then_write, args=(tmp_path, queue))
    proc.start()
    assert queue.get(timeout=120) == ("Step", [0, 1, 2])
    proc.join(60)
    assert proc.exitcode == 0
    assert type(rb[:]) is Step and rb[:].step.tolist() == [0, 1, 2, 7]
