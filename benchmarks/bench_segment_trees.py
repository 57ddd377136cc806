"""Micro-benchmark of the priority segment trees: one scan + one update per step.

Run from the repository root (with the packages installed, as ``nox -s bench`` does)::

    python benchmarks/bench_segment_trees.py [--capacity 1000000] [--seconds 1.0]

Each printed line is a JSON object (``_common.report``) for one backend/device/batch size: the
throughput of a step (``scan_lower_bound`` of B masses followed by ``update`` of the B sampled
leaves, as a prioritized sampler does) in sampled-and-updated items per second, and the time of
one step in microseconds. Nothing here is asserted.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np
import torch
from _common import device_sync, rate, report

from tdreplay.samplers.segment_trees import NumbaSumTree, TorchSumTree


def numba_step(capacity: int, init: np.ndarray, batch: int, rng: np.random.Generator
               ) -> Callable[[], None]:
    """A scan + update step on a filled numba tree."""
    tree = NumbaSumTree(capacity)
    tree.update(np.arange(capacity), init)

    def step() -> None:
        idx = tree.scan_lower_bound(rng.random(batch) * tree.total())
        tree.update(idx, rng.random(batch) + 0.01)

    return step


def torch_step(capacity: int, init: np.ndarray, batch: int, device: str) -> Callable[[], None]:
    """A scan + update step on a filled torch tree (synchronised on CUDA)."""
    tree = TorchSumTree(capacity, device=device)
    tree.update(torch.arange(capacity, device=device), torch.from_numpy(init).to(device))
    gen = torch.Generator(device=device).manual_seed(0)
    sync = device_sync(device)

    def step() -> None:
        u = torch.rand(batch, dtype=torch.float64, device=device, generator=gen)
        idx = tree.scan_lower_bound(u * tree.total())
        tree.update(idx, u + 0.01)
        sync()

    return step


def bench_segment_trees(capacity: int = 1_000_000, seconds: float = 1.0) -> None:
    """Run every case and print one line each."""
    cases: list[tuple[str, str, int]] = [("numba", "cpu", b) for b in (256, 4096)]
    cases += [("torch", "cpu", b) for b in (256, 4096, 65536)]
    if torch.cuda.is_available():
        cases += [("torch", "cuda", b) for b in (256, 4096, 65536)]
    rng = np.random.default_rng(0)
    init = rng.random(capacity) + 0.01
    for backend, device, batch in cases:
        if backend == "numba":
            step = numba_step(capacity, init, batch, rng)
        else:
            step = torch_step(capacity, init, batch, device)
        steps_per_s = rate(step, min_time=seconds)  # warms up first (numba compilation, CUDA)
        report(f"segment tree scan+update {backend}/{device} C={capacity} B={batch}",
               batch * steps_per_s, "items/s", us_per_step=round(1e6 / steps_per_s, 1))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacity", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args()
    bench_segment_trees(args.capacity, args.seconds)
