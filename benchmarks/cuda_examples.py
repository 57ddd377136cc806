"""The reference's three CUDA prioritized examples, timed on ``tdreplay.data`` or ``torchrl.data``.

The same code runs on either library (tdreplay keeps TorchRL's API: ``--lib`` picks the module),
so one GPU gives both sides of the comparison. The examples (``reference/001``): rows
``{obs[32], td_error}``, ``batch_size=65_536``, ``alpha=0.7``, ``beta=0.5``:

- ``all_cuda``: ``LazyTensorStorage(capacity, device="cuda")``, the trees on the storage's device;
- ``memmap_cuda_trees``: ``LazyMemmapStorage(capacity)`` on the host, ``sampler_device="cuda"``;
- ``cuda_cpu_trees``: ``LazyTensorStorage(capacity, device="cuda")``, ``sampler_device="cpu"``.

Each is filled to ``capacity`` with extends of 100,000 rows, then timed (CUDA synchronized
around every call, medians over ``--reps`` calls after 3 warm-ups): ``extend`` of 100,000 rows
into the full buffer, ``sample()``, ``update_tensordict_priority`` of a sample with fresh
``td_error``, and ``cycle`` (one sample and its update) per second. A case the library refuses
is reported with its error instead of figures. A TorchRL without ``sampler_device`` (before
0.13) keeps its trees on the host: ``cuda_cpu_trees`` is built without the argument there, and
``memmap_cuda_trees`` is reported as refused. One JSON line per case on stdout and, with
``--out``, in that file. ``merge`` joins a tdreplay and a TorchRL file into one table with
ratios (TorchRL time over tdreplay time: above 1, tdreplay is faster).

``--device cpu`` runs the same cases on the host (small with ``--capacities 20000 --batch 512
--chunk 5000``), to check the script without a GPU (``integration_tests/test_cuda_examples.py``).
``benchmarks/gpu_check.sh`` runs it on a lent GPU machine, for both libraries (it is not a
``bench_*.py``: ``nox -s bench`` does not run it).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import sys
import tempfile
import time
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import torch
from _common import device_name, device_sync, median_ms
from tensordict import TensorDict

CASES = ("all_cuda", "memmap_cuda_trees", "cuda_cpu_trees")


def make_buffer(data: Any, case: str, device: str, capacity: int, batch: int,
                scratch: str) -> tuple[Any, str]:
    """The buffer of ``case`` on ``data`` (``tdreplay.data`` or ``torchrl.data``) and the device
    its rows are extended from."""
    if case == "memmap_cuda_trees":
        storage = data.LazyMemmapStorage(capacity, scratch_dir=scratch)
        trees, rows_on = device, "cpu"
    else:  # all_cuda: the trees where the storage is; cuda_cpu_trees: on the host
        storage = data.LazyTensorStorage(capacity, device=device)
        trees, rows_on = (None if case == "all_cuda" else "cpu"), device
    placed = {} if trees is None else {"sampler_device": trees}
    if placed and not takes_sampler_device(data):
        if trees != "cpu":
            raise TypeError(f"{data.__name__}.TensorDictPrioritizedReplayBuffer has no "
                            f"sampler_device: its trees stay on the host")
        placed = {}  # the host is where its trees always are
    rb = data.TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=storage,
                                                batch_size=batch, priority_key="td_error",
                                                **placed)
    return rb, rows_on


def takes_sampler_device(data: Any) -> bool:
    """Whether ``data``'s prioritized buffer places its trees (``sampler_device``)."""
    params = inspect.signature(data.TensorDictPrioritizedReplayBuffer).parameters
    return "sampler_device" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD
                                             for p in params.values())


def filled_buffer(data: Any, case: str, device: str, capacity: int, batch: int, chunk: int,
                  scratch: str) -> tuple[float, dict[str, Callable[[], object]]]:
    """Fill the buffer of ``case`` to ``capacity`` with extends of ``chunk`` rows: the fill's
    seconds, and the calls on it that the figures time: ``extend`` of ``chunk`` rows, ``sample()`` and
    ``update`` (``update_tensordict_priority`` of a sample with fresh ``td_error``)."""
    sync = device_sync(device)
    rb, rows_on = make_buffer(data, case, device, capacity, batch, scratch)
    rows = TensorDict({"obs": torch.randn(chunk, 32, device=rows_on),
                       "td_error": torch.ones(chunk, device=rows_on)}, [chunk])
    start = time.perf_counter()
    for _ in range(-(-capacity // chunk)):
        rb.extend(rows)
    sync()
    fill_s = time.perf_counter() - start
    sample = rb.sample()

    def update() -> None:
        sample["td_error"] = torch.rand(sample.shape, device=sample.device)
        rb.update_tensordict_priority(sample)

    return fill_s, {"extend": lambda: rb.extend(rows), "sample": rb.sample, "update": update}


def run_case(data: Any, case: str, device: str, capacity: int, batch: int, chunk: int,
             reps: int) -> dict[str, Any]:
    """Fill the buffer of ``case`` and time it; the figures (or the error) as a dict."""
    with tempfile.TemporaryDirectory() as scratch:
        try:
            fill_s, calls = filled_buffer(data, case, device, capacity, batch, chunk, scratch)
            sync = device_sync(device)
            ms = {name: median_ms(call, sync, reps) for name, call in calls.items()}
        except Exception as err:  # the library refuses the case: report why
            return {"error": f"{type(err).__name__}: {err}"}
    cycle_ms = ms["sample"] + ms["update"]
    return {"fill_s": fill_s, "ms": ms, "cycles_per_s": 1e3 / cycle_ms}


def measure(args: argparse.Namespace) -> None:
    data = importlib.import_module(f"{args.lib}.data")
    info = {"lib": args.lib, "version": version_of(args.lib), "torch": torch.__version__,
            "device": device_name(args.device), "threads": torch.get_num_threads()}
    if args.out:
        Path(args.out).write_text("")
    for capacity in args.capacities:
        for case in args.cases:
            row = {"case": case, "capacity": capacity, "batch": args.batch, **info,
                   **run_case(data, case, args.device, capacity, args.batch, args.chunk,
                              args.reps)}
            line = json.dumps(row)
            print(line, flush=True)
            if args.out:  # line by line: what ran is kept if the machine is taken back
                with open(args.out, "a") as out:
                    out.write(line + "\n")


def version_of(lib: str) -> str:
    """The installed version of ``lib`` (tdreplay: of tdreplay-core), or ``source`` when it runs
    from a checkout."""
    try:
        return version("tdreplay-core" if lib == "tdreplay" else lib)
    except PackageNotFoundError:
        return "source"


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of ``path`` (none if it was not written: that library did not run)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def merge(tdreplay_file: Path, torchrl_file: Path, out: Path) -> dict[str, Any]:
    """One table of both libraries' rows, with ``torchrl / tdreplay`` time ratios per figure
    (``cycle``: tdreplay's cycles per second over TorchRL's) where both have figures."""
    ours = read_rows(tdreplay_file)
    theirs = {(r["case"], r["capacity"]): r for r in read_rows(torchrl_file)}
    table = []
    for row in ours:
        peer = theirs.get((row["case"], row["capacity"]), {})
        ratios = {}
        if "ms" in row and "ms" in peer:
            ratios = {name: peer["ms"][name] / row["ms"][name] for name in row["ms"]}
            ratios["cycle"] = row["cycles_per_s"] / peer["cycles_per_s"]
        table.append({"case": row["case"], "capacity": row["capacity"], "tdreplay": row,
                      "torchrl": peer, "torchrl_time_over_tdreplay": ratios})
    result = {"device": ours[0]["device"] if ours else None, "rows": table}
    out.write_text(json.dumps(result, indent=1) + "\n")
    return result


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["merge"]:
        parser = argparse.ArgumentParser(prog="cuda_examples.py merge")
        parser.add_argument("tdreplay_file", type=Path)
        parser.add_argument("torchrl_file", type=Path)
        parser.add_argument("--out", type=Path, required=True)
        merged = parser.parse_args(argv[1:])
        merge(merged.tdreplay_file, merged.torchrl_file, merged.out)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lib", choices=("tdreplay", "torchrl"), default="tdreplay")
    parser.add_argument("--device", default="cuda", help="cuda, or cpu to check the script")
    parser.add_argument("--capacities", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--batch", type=int, default=65_536)
    parser.add_argument("--chunk", type=int, default=100_000, help="rows per extend")
    parser.add_argument("--reps", type=int, default=20, help="timed calls per figure")
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    parser.add_argument("--out", help="also write the JSON lines here")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (default: torch's own choice); tdreplay "
                             "splits the host trees' large draws and updates over as many")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    measure(args)


if __name__ == "__main__":
    main()
