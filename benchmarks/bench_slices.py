"""Slice sampling: ``sample(1024)`` as 32 slices of 32 steps, trajectories of 200 steps.

Run from the repository root::

    python benchmarks/bench_slices.py [--quick]

Configurations (issue 5): a 1,000,000-step buffer, and a 100,000,000-slot buffer filled to 50%
and to 100%. Rows are tiny (an int32 trajectory id) so the large buffer fits in memory; the
1M buffer is also measured with transition rows. The target is >= 1,500 samples/s, flat in the
buffer size (TorchRL's SliceSampler scans the buffer at every batch unless values are
cached). ``extend_10k_plus_sample`` times one 10,000-step extend followed by one batch on the
full buffer: the bookkeeping of the new steps is paid there, in O(new steps).

Each line printed is a JSON object (collected by ``benchmarks/run_all.py``). Nothing is
asserted.
"""

from __future__ import annotations

import argparse
import itertools
import time

import torch
from _common import rate, report, transition_batch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.samplers import SliceSampler
from tdreplay.storages import LazyTensorStorage

TRAJ_LEN = 200
CHUNK = 1_000_000


def tiny_rows(start: int, n: int) -> TensorDict:
    """``n`` steps from global step ``start``: only an int32 trajectory id."""
    steps = torch.arange(start, start + n, dtype=torch.int64)
    return TensorDict({"episode": (steps // TRAJ_LEN).to(torch.int32)}, [n])


def buffer(capacity: int) -> TensorDictReplayBuffer:
    return TensorDictReplayBuffer(storage=LazyTensorStorage(capacity),
                                  sampler=SliceSampler(num_slices=32, traj_key="episode"),
                                  batch_size=1024)


def fill(rb: TensorDictReplayBuffer, stop: int, make=tiny_rows, start: int = 0) -> float:
    """Write steps ``start .. stop - 1`` in chunks of 1M, then sample once; return the seconds
    spent."""
    begin = time.perf_counter()
    written = start
    while written < stop:
        n = min(CHUNK, stop - written)
        rb.extend(make(written, n))
        written += n
    rb.sample()  # the first batch brings the trajectory bookkeeping up to date
    return time.perf_counter() - begin


def index_megabytes(rb: TensorDictReplayBuffer) -> float:
    """Memory of the slice sampler's trajectory index (its arrays), in MB (issue 19: it held
    one record row per step of a 4M-step write block, ~225-470 MB whatever the trajectories)."""
    index = rb.sampler._index  # benchmarks may look inside
    arrays = (index.rec, index.dense, index.free, index.counters, index.lanes_arr,
              index.slot_rec)
    return sum(a.nbytes for a in arrays) / 1e6


def transitions(start: int, n: int) -> TensorDict:
    td = transition_batch(n)
    td["episode"] = (torch.arange(start, start + n) // TRAJ_LEN).to(torch.int32)
    return td


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="10M instead of 100M slots")
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    large = 10_000_000 if args.quick else 100_000_000

    rb = buffer(1_000_000)
    fill(rb, 1_000_000)
    report("slices/tiny_rows/1M_full/sample_1024", rate(rb.sample, min_time=args.seconds),
           "calls/s", capacity=1_000_000, filled=1_000_000)
    del rb

    rb = buffer(1_000_000)
    fill(rb, 1_000_000, make=transitions)
    report("slices/transition_rows/1M_full/sample_1024", rate(rb.sample, min_time=args.seconds),
           "calls/s", capacity=1_000_000, filled=1_000_000)
    del rb

    rb = buffer(large)
    half = large // 2
    seconds = fill(rb, half)
    report(f"slices/tiny_rows/{large // 1_000_000}M_half/fill_and_first_sample", seconds, "s",
           capacity=large, filled=half)
    report(f"slices/tiny_rows/{large // 1_000_000}M_half/sample_1024",
           rate(rb.sample, min_time=args.seconds), "calls/s", capacity=large, filled=half)
    # fill the second half (the bookkeeping of these steps is incremental), then wrap
    seconds = fill(rb, large, start=half)
    report(f"slices/tiny_rows/{large // 1_000_000}M_full/second_half_and_first_sample",
           seconds, "s", capacity=large, filled=large)
    report(f"slices/tiny_rows/{large // 1_000_000}M_full/sample_1024",
           rate(rb.sample, min_time=args.seconds), "calls/s", capacity=large, filled=large)
    report(f"slices/tiny_rows/{large // 1_000_000}M_full/index_size", index_megabytes(rb), "MB",
           capacity=large, filled=large, trajectories=rb.sampler._index.num_trajectories)
    chunks = itertools.count(large, 10_000)

    def extend_then_sample() -> None:
        rb.extend(tiny_rows(next(chunks), 10_000))
        rb.sample()

    report(f"slices/tiny_rows/{large // 1_000_000}M_full/extend_10k_plus_sample",
           rate(extend_then_sample, min_time=args.seconds), "calls/s", capacity=large,
           filled=large)


if __name__ == "__main__":
    main()
