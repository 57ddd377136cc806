"""Micro-benchmark of the priority segment trees: one scan + one update per step.

Run from the repository root::

    python benchmarks/bench_segment_trees.py [--capacity 1000000] [--seconds 1.0]

Each printed line is a JSON object (the format ``benchmarks/run_all.py`` collects) for one
backend/device/batch size: the throughput of a step (``scan_lower_bound`` of B masses followed by
``update`` of the B sampled leaves, as a prioritized sampler does) in sampled-and-updated items
per second, and the time of one step in microseconds. Nothing here is asserted.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

try:
    from tdreplay.samplers.segment_trees import NumbaSumTree, TorchSumTree
except ImportError:  # running from a source checkout without installing
    _root = pathlib.Path(__file__).resolve().parents[1]
    for _pkg in ("tdreplay-core", "tdreplay-samplers"):
        sys.path.insert(0, str(_root / "packages" / _pkg / "src"))
    from tdreplay.samplers.segment_trees import NumbaSumTree, TorchSumTree

import numpy as np
import torch


def bench_segment_trees(capacity: int = 1_000_000, seconds: float = 1.0) -> list[dict]:
    """Run every case and print one line each; return the measurements."""
    cases: list[tuple[str, str, int]] = [("numba", "cpu", b) for b in (256, 4096)]
    cases += [("torch", "cpu", b) for b in (256, 4096, 65536)]
    if torch.cuda.is_available():
        cases += [("torch", "cuda", b) for b in (256, 4096, 65536)]
    rng = np.random.default_rng(0)
    init = rng.random(capacity) + 0.01
    results = []
    for backend, device, batch in cases:
        if backend == "numba":
            tree = NumbaSumTree(capacity)
            tree.update(np.arange(capacity), init)

            def step(tree=tree, batch=batch):
                idx = tree.scan_lower_bound(rng.random(batch) * tree.total())
                tree.update(idx, rng.random(batch) + 0.01)

            sync = lambda: None  # noqa: E731
        else:
            tree = TorchSumTree(capacity, device=device)
            tree.update(torch.arange(capacity, device=device), torch.from_numpy(init).to(device))
            gen = torch.Generator(device=device).manual_seed(0)

            def step(tree=tree, batch=batch, device=device, gen=gen):
                u = torch.rand(batch, dtype=torch.float64, device=device, generator=gen)
                idx = tree.scan_lower_bound(u * tree.total())
                tree.update(idx, u + 0.01)

            sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        for _ in range(3):  # warm-up (numba compilation, CUDA context)
            step()
        sync()
        n = 0
        start = time.perf_counter()
        while True:
            step()
            n += 1
            if n % 5 == 0:
                sync()
                if time.perf_counter() - start > seconds:
                    break
        sync()
        elapsed = time.perf_counter() - start
        per_step = elapsed / n
        res = {
            "backend": backend,
            "device": device,
            "batch": batch,
            "us_per_step": per_step * 1e6,
            "items_per_s": batch / per_step,
        }
        results.append(res)
        # one JSON line per case, the format benchmarks/run_all.py collects
        print(
            json.dumps(
                {
                    "name": f"segment tree scan+update {backend}/{device} C={capacity} B={batch}",
                    "value": round(res["items_per_s"], 1),
                    "unit": "items/s",
                    "us_per_step": round(res["us_per_step"], 1),
                }
            ),
            flush=True,
        )
        del tree
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacity", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args()
    bench_segment_trees(args.capacity, args.seconds)
