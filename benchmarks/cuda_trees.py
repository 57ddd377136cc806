"""The device sum tree's operations alone, each with its Triton kernels and with tensor
operations (``TDREPLAY_TRITON=0``), on a GPU: the descent, the sum update and the refresh of the
min over the sums.

``benchmarks/gpu_check.sh`` runs it (step ``trees``) after the tests. Each row times one
operation of a full tree of ``capacity`` slots on ``batch`` indices or masses both ways: the
median of ``--reps`` calls after 3 warm-ups, the device synchronized around every call, in
milliseconds, and whether both ways gave the same result (leaves drawn, or tree nodes).
``--device cpu`` checks the script without a GPU (tensor operations both times).

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
from _common import device_name, device_sync, median_ms

from tdreplay.samplers.segment_trees import SumSegmentTree, make_min_over_sum


def both_ways(op: str, run: Callable[[], object], result: Callable[[], torch.Tensor],
              sync: Callable[[], None], reps: int) -> dict[str, Any]:
    """The row of ``op``: the median time of ``run`` with the Triton kernels on and off, and
    whether ``result`` (read after the runs) was the same both ways."""
    row: dict[str, Any] = {"op": op}
    results = []
    for switch, column in (("1", "triton_ms"), ("0", "tensor_ops_ms")):
        with mock.patch.dict(os.environ, TDREPLAY_TRITON=switch):
            row[column] = median_ms(run, sync, reps)
            results.append(result())
    row["same_result"] = bool(torch.equal(*results))
    return row


def read_nodes(nodes: torch.Tensor, scratch: int) -> torch.Tensor:
    """A copy of ``nodes`` without the never-read ``scratch`` position: the losers of duplicate
    indices write there, in an order the device does not fix."""
    copy = nodes.clone()
    copy[scratch] = 0.0
    return copy


def measure(capacity: int, batch: int, device: str, reps: int) -> list[dict[str, Any]]:
    """The rows of one capacity."""
    sync = device_sync(device)
    gen = torch.Generator(device=device).manual_seed(0)
    tree = SumSegmentTree(capacity, backend="torch", device=device)
    tree.update(torch.arange(capacity, device=device),
                torch.rand(capacity, device=device, dtype=torch.float64, generator=gen) + 0.01)
    minima = make_min_over_sum(tree)
    masses = torch.rand(batch, device=device, dtype=torch.float64, generator=gen) * tree.total()
    index = torch.randint(0, capacity, (batch,), device=device, generator=gen)
    values = torch.rand(batch, device=device, dtype=torch.float64, generator=gen) + 0.01
    base = {"capacity": capacity, "batch": batch, "device": device_name(device)}
    rows = [
        both_ways("descent", lambda: tree.scan_lower_bound(masses),
                  lambda: tree.scan_lower_bound(masses), sync, reps),
        # the same update again and again: the nodes after it do not depend on the repeats
        both_ways("sum update", lambda: tree.update(index, values),
                  lambda: read_nodes(tree.nodes, tree.layout.scratch), sync, reps),
        both_ways("min refresh", lambda: minima.refresh(index),
                  lambda: read_nodes(minima.nodes, tree.layout.scratch), sync, reps),
    ]
    return [{**base, **row} for row in rows]


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
