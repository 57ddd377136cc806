"""The device sum tree's operations alone: the descent (Triton kernel, and tensor operations with
``TDREPLAY_TRITON=0``) and the update, on a GPU.

``benchmarks/gpu_check.sh`` runs it (step ``trees``) after the tests. Each row times one
operation of a full tree of ``capacity`` slots on ``batch`` indices or masses: the median of
``--reps`` calls after 3 warm-ups, the device synchronized around every call, in milliseconds;
``descent`` rows also say whether both descents gave the same leaves. ``--device cpu`` checks
the script without a GPU (the descent is then tensor operations both times).

    python benchmarks/cuda_trees.py --capacities 1000000 10000000 --batch 65536 --out trees.json
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from typing import Any
from unittest import mock

import torch
from _common import device_name, median_ms

from tdreplay.samplers.segment_trees import SumSegmentTree, make_min_over_sum


def descent_ms(tree: Any, masses: torch.Tensor, sync: Callable[[], None], reps: int,
               triton: bool) -> tuple[float, torch.Tensor]:
    """The descent's median time and its leaves, with the Triton kernel on or off."""
    with mock.patch.dict(os.environ, TDREPLAY_TRITON="1" if triton else "0"):
        return median_ms(lambda: tree.scan_lower_bound(masses), sync, reps), \
            tree.scan_lower_bound(masses)


def measure(capacity: int, batch: int, device: str, reps: int) -> list[dict[str, Any]]:
    """The rows of one capacity."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    gen = torch.Generator(device=device).manual_seed(0)
    tree = SumSegmentTree(capacity, backend="torch", device=device)
    tree.update(torch.arange(capacity, device=device),
                torch.rand(capacity, device=device, dtype=torch.float64, generator=gen) + 0.01)
    minima = make_min_over_sum(tree)
    masses = torch.rand(batch, device=device, dtype=torch.float64, generator=gen) * tree.total()
    kernel_ms, kernel_leaves = descent_ms(tree, masses, sync, reps, triton=True)
    ops_ms, ops_leaves = descent_ms(tree, masses, sync, reps, triton=False)
    index = torch.randint(0, capacity, (batch,), device=device, generator=gen)
    values = torch.rand(batch, device=device, dtype=torch.float64, generator=gen) + 0.01
    base = {"capacity": capacity, "batch": batch, "device": device_name(device)}
    return [
        {**base, "op": "descent", "triton_ms": kernel_ms, "tensor_ops_ms": ops_ms,
         "same_leaves": bool(torch.equal(kernel_leaves, ops_leaves))},
        {**base, "op": "sum update", "ms": median_ms(lambda: tree.update(index, values), sync,
                                                     reps)},
        {**base, "op": "min refresh", "ms": median_ms(lambda: minima.refresh(index), sync, reps)},
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda, or cpu to check the script")
    parser.add_argument("--capacities", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--batch", type=int, default=65_536)
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--out", help="also write the JSON lines here")
    args = parser.parse_args()
    lines = []
    for capacity in args.capacities:
        for row in measure(capacity, args.batch, args.device, args.reps):
            lines.append(json.dumps(row))
            print(lines[-1], flush=True)
    if args.out:
        with open(args.out, "w") as out:
            out.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
