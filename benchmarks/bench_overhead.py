"""Per-call overhead of the hot paths, in microseconds per call (lower is better).

Small calls are where Python-level work (checks, conversions, building TensorDicts) shows:

- ``overhead/storage_get_256``: ``LazyTensorStorage.get`` of 256 random slots;
- ``overhead/storage_set_row``: ``LazyTensorStorage.set`` of one row (an int row);
- ``overhead/extend_32``: ``ReplayBuffer.extend`` of a 32-row TensorDict;
- ``overhead/add_row``: ``ReplayBuffer.add`` of one row (a TensorDict without batch dims);
- ``overhead/sample_256``: ``ReplayBuffer.sample(256)``;
- ``overhead/td_sample_256`` / ``overhead/td_extend_32``: the same on a
  ``TensorDictReplayBuffer`` (which writes ``index`` into the TensorDicts);
- ``overhead/prio_extend_32``: ``TensorDictPrioritizedReplayBuffer.extend`` of 32 rows carrying
  ``td_error`` (initial priorities); ``overhead/prio_add_row``: its ``add`` of one such row.

Rows are those of ``bench_uniform.py`` (``obs[32]``, ``action[4]``, ``next.obs[32]``,
``next.reward[1]``, ``next.done[1]``) in a 100,000-slot buffer, full. Each figure is the fastest
of ``--repeats`` timing windows, in CPU time of this process (``wall_us`` beside it); each
line carries the machine's load average.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import torch
from _common import report, transition_batch, transition_batches

from tdreplay.core import ReplayBuffer, TensorDictReplayBuffer
from tdreplay.samplers import TensorDictPrioritizedReplayBuffer
from tdreplay.storages import LazyTensorStorage

CAPACITY = 100_000


def micros(fn: Callable[[], object], min_time: float, repeats: int) -> tuple[float, float]:
    """``(CPU, wall)`` microseconds per call of ``fn``: the fastest of ``repeats`` windows of
    ``min_time`` CPU seconds. The CPU time of this process in its least disturbed window is the
    figure to compare on a shared machine (other processes take wall time, not this process's
    CPU time, though they still slow it down through the caches)."""
    for _ in range(20):
        fn()
    cpu_per_call, wall_per_call = [], []
    for _ in range(repeats):
        calls = 0
        start, wall = time.process_time(), time.perf_counter()
        while (elapsed := time.process_time() - start) < min_time:
            fn()
            calls += 1
        cpu_per_call.append(elapsed / calls * 1e6)
        wall_per_call.append((time.perf_counter() - wall) / calls * 1e6)
    return min(cpu_per_call), min(wall_per_call)


def filled(rb: ReplayBuffer) -> ReplayBuffer:
    chunk = transition_batch(10_000)
    for _ in range(CAPACITY // 10_000):
        rb.extend(chunk.clone())
    return rb


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-time", type=float, default=0.3)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: per-call "
                        "overhead, not parallel speed)")
    args = parser.parse_args()
    t, r = args.min_time, args.repeats

    torch.set_num_threads(args.threads)

    def out(name: str, value: tuple[float, float]) -> None:
        report(f"overhead/{name}", value[0], "us/call", wall_us=round(value[1], 2),
               loadavg_1m=round(os.getloadavg()[0], 2), threads=torch.get_num_threads())

    rb = filled(ReplayBuffer(storage=LazyTensorStorage(CAPACITY)))
    storage = rb.storage
    idx = torch.randint(0, CAPACITY, (256,))
    out("storage_get_256", micros(lambda: storage.get(idx), t, r))
    row = transition_batch(1)[0]
    out("storage_set_row", micros(lambda: storage.set(17, row), t, r))
    small = transition_batches(32)
    out("extend_32", micros(lambda: rb.extend(next(small)), t, r))
    out("add_row", micros(lambda: rb.add(row), t, r))
    out("sample_256", micros(lambda: rb.sample(256), t, r))

    td_rb = filled(TensorDictReplayBuffer(storage=LazyTensorStorage(CAPACITY)))
    out("td_extend_32", micros(lambda: td_rb.extend(next(small)), t, r))
    out("td_sample_256", micros(lambda: td_rb.sample(256), t, r))

    prio = filled(TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5,
                                                    storage=LazyTensorStorage(CAPACITY)))
    batches = [transition_batch(32) for _ in range(4)]
    for b in batches:
        b["td_error"] = torch.rand(32)
    k = [0]

    def prio_extend() -> None:
        k[0] += 1
        prio.extend(batches[k[0] % 4])

    out("prio_extend_32", micros(prio_extend, t, r))
    out("prio_sample_256", micros(lambda: prio.sample(256), t, r))
    prio_row = batches[0][0]
    out("prio_add_row", micros(lambda: prio.add(prio_row), t, r))


if __name__ == "__main__":
    main()
