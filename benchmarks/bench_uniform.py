"""Uniform replay: extend and sample throughput on a 1,000,000-slot LazyTensorStorage.

Targets (issue 2): extend >= 25M rows/s in 10,000-row chunks, >= 25,000 extends/s of 1,000
rows, sample(256) >= 14,000/s, sample(4096) >= 2,000/s.
"""

from __future__ import annotations

from _common import rate, report, transition_batch, transition_batches

from tdreplay.core import ReplayBuffer, TensorDictReplayBuffer
from tdreplay.storages import LazyTensorStorage

CAPACITY = 1_000_000


def filled(buffer_cls: type) -> ReplayBuffer:
    rb = buffer_cls(storage=LazyTensorStorage(CAPACITY))
    chunk = transition_batch(100_000)
    for _ in range(CAPACITY // 100_000):
        rb.extend(chunk)
    return rb


def main() -> None:
    for buffer_cls in (ReplayBuffer, TensorDictReplayBuffer):
        tag = buffer_cls.__name__
        rb = buffer_cls(storage=LazyTensorStorage(CAPACITY))
        chunks = transition_batches(10_000)
        calls = rate(lambda: rb.extend(next(chunks)), min_time=2.0)
        report(f"uniform/{tag}/extend_10k_rows", calls * 10_000, "rows/s")
        small = transition_batches(1_000)
        report(f"uniform/{tag}/extend_1k_calls", rate(lambda: rb.extend(next(small)), min_time=2.0),
               "calls/s")
        rb = filled(buffer_cls)
        report(f"uniform/{tag}/sample_256", rate(lambda: rb.sample(256), min_time=2.0), "calls/s")
        report(f"uniform/{tag}/sample_4096", rate(lambda: rb.sample(4096), min_time=2.0), "calls/s")


if __name__ == "__main__":
    main()
