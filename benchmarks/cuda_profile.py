"""Where one prioritized cycle on CUDA trees spends its time: ``sample()``,
``update_tensordict_priority`` and ``extend`` of the CUDA examples (``benchmarks/cuda_examples.py``;
``--cases``, by default ``all_cuda``), each call profiled alone after warm-ups.

For each call it prints the wall time (median of ``--reps``, device synchronized around each
call), the number of kernels it launched and their total device time (``torch.profiler``), and
the Python functions with the most own time (``cProfile``, top ``--top``). A call whose wall
time is far above its kernels' time is bound by the host: launches and Python.

    python benchmarks/cuda_profile.py --capacities 1000000 10000000 --batch 65536
    python benchmarks/cuda_profile.py --cases memmap_cuda_trees cuda_cpu_trees

``--device cpu`` runs it on the host (numba trees, no kernels), to check the script.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import tempfile
from collections.abc import Callable

import torch
from _common import device_sync, median_ms
from cuda_examples import CASES, filled_buffer
from torch.profiler import ProfilerActivity, profile


def kernels(fn: Callable[[], object], device: str) -> tuple[int, float]:
    """The kernels ``fn`` launches once (count) and their summed device time in ms."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        fn()
        device_sync(device)()
    launched = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return len(launched), sum(e.device_time for e in launched) / 1e3


def hot_functions(fn: Callable[[], object], reps: int, top: int) -> str:
    """``cProfile``'s ``top`` functions by own time over ``reps`` calls of ``fn``."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(reps):
        fn()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    return "\n".join(line for line in out.getvalue().splitlines()[6:] if line.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--capacities", type=int, nargs="+", default=[1_000_000])
    parser.add_argument("--batch", type=int, default=65_536)
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--cases", nargs="+", choices=CASES, default=["all_cuda"])
    args = parser.parse_args()
    import tdreplay.data

    sync = device_sync(args.device)
    for case in args.cases:
        for capacity in args.capacities:
            with tempfile.TemporaryDirectory() as scratch:
                _, calls = filled_buffer(tdreplay.data, case, args.device, capacity,
                                         args.batch, min(100_000, capacity), scratch)
                for name in ("sample", "update", "extend"):
                    fn = calls[name]
                    wall = median_ms(fn, sync, args.reps)
                    count, device_ms = kernels(fn, args.device)
                    print(f"== {case} capacity {capacity} {name}: {wall:.3f} ms wall, {count} "
                          f"kernels, {device_ms:.3f} ms on the device")
                    print(hot_functions(fn, args.reps, args.top), flush=True)


if __name__ == "__main__":
    main()
