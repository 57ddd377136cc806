"""One peer of ``nox -s bench-peers``: the same workloads on tdreplay, cpprb, TorchRL or the floor.

Usage: ``python benchmarks/peers.py PEER [--quick] [--seconds S] [--threads N] [--dir D]``
with PEER one of ``tdreplay``, ``floor``, ``floor_td``, ``cpprb``, ``torchrl``. Each peer runs in its own
interpreter (cpprb and TorchRL in virtualenvs of their own, see ``noxfile.py``), prints one JSON
line per measurement (``_common.report``) and one per workload it cannot run
(``{"name": ..., "skipped": why}``); ``peers_run.py`` runs them all and merges the lines.

The floor is bare torch on preallocated tensors, with the same torch: a dict of tensors made
with ``torch.empty``, seen through numpy views made once, a slice assignment to write and
``torch.randint`` + ``take`` of the rows to sample (both faster than torch's ``copy_`` and
``index_select`` on one thread). A buffer cannot do less work than that. ``floor_td`` is the
same floor behind TorchRL's interface (TensorDicts in and out, the slots returned); only
``instructions.py`` counts it, to tell the interface's cost from tdreplay's own.

Workloads (``METRICS``), on 1,000,000 slots of transition rows ``{obs[32], action[4],
next.obs[32], next.reward[1], next.done[1] bool}`` (277 bytes) unless said otherwise:

- ``first_fill_10k``: a new buffer filled with 10,000-row extends, allocation included;
- ``extend_10k_full`` / ``extend_1k``: extends of 10,000 / 1,000 rows into the full buffer;
- ``sample_256`` / ``sample_4096``: uniform samples from the full buffer;
- ``prioritized_cycle_B256`` / ``_B4096``: ``sample(B)`` then updating the B priorities
  (alpha 0.7, beta 0.5; every slot written with a random priority first);
- ``slices_32x32`` / ``slices_32x32_cached``: 32 slices of 32 steps from trajectories of 200
  steps, without and with ``cache_values=True`` (TorchRL rescans the buffer at every batch
  unless values are cached, and every extend drops the cache);
- ``memmap_*``: first fill, 10,000-row extends into the full buffer and ``sample(256)`` of a
  memory-mapped storage (files in ``--dir``; cpprb has none);
- ``scaling/*``: uniform ``sample(B)`` and prioritized cycles at B = 256 and 4096 on buffers of
  33-byte rows (``obs[8]`` float32, ``done`` bool) from 1M to 100M rows (``--quick``: to 10M);
  priorities start equal (new rows get the max priority) and every cycle writes random ones.
  A size whose buffer would not fit in the memory available now is skipped, with the reason.

Rates are the median of three timing windows of ``--seconds / 3`` (``runs`` holds all three),
by ``_common.rate``; a one-off (a first fill) is timed as one call of ``rate``. Each peer's
library is imported before the first timing. ``cpu_rate``
is the same rate by this process's CPU time (steadier on a shared machine). torch runs on
``--threads`` threads (1 by default: cpprb uses one, and the machine is shared).
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _common import rate, report, transition_batch
from tensordict import TensorDict

CAPACITY = 1_000_000
TRAJ_LEN = 200
ALPHA, BETA = 0.7, 0.5
SCALING_SIZES = [1_000_000, 3_000_000, 10_000_000, 30_000_000, 100_000_000]
QUICK_SIZES = [1_000_000, 3_000_000, 10_000_000]
SCALING_CHUNK = 1_000_000
TINY_ROW_BYTES = 33
#: bytes per slot a prioritized buffer may need besides the rows (trees, generations): generous
PRIORITY_BYTES_PER_SLOT = 48

#: name -> (label, unit) of every workload, in the order of the issue's table
METRICS: dict[str, tuple[str, str]] = {
    "first_fill_10k": ("first fill of 1M rows, 10k-row extends (allocation included)", "rows/s"),
    "extend_10k_full": ("extend of 10k rows into a full buffer", "rows/s"),
    "extend_1k": ("extend calls of 1,000 rows", "calls/s"),
    "sample_256": ("sample(256)", "calls/s"),
    "sample_4096": ("sample(4096)", "calls/s"),
    "prioritized_cycle_B256": ("prioritized sample + update, B=256", "cycles/s"),
    "prioritized_cycle_B4096": ("prioritized sample + update, B=4096", "cycles/s"),
    "slices_32x32": ("slice sampling 32x32", "calls/s"),
    "slices_32x32_cached": ("slice sampling 32x32, cache_values=True", "calls/s"),
    "memmap_first_fill_10k": ("memmap first fill, 10k-row extends", "rows/s"),
    "memmap_extend_10k_full": ("memmap extend of 10k rows into a full buffer", "rows/s"),
    "memmap_sample_256": ("memmap sample(256)", "calls/s"),
    "scaling/uniform_sample_256": ("uniform sample(256), 33-byte rows", "calls/s"),
    "scaling/uniform_sample_4096": ("uniform sample(4096), 33-byte rows", "calls/s"),
    "scaling/prioritized_cycle_B256": ("prioritized cycle B=256, 33-byte rows", "cycles/s"),
    "scaling/prioritized_cycle_B4096": ("prioritized cycle B=4096, 33-byte rows", "cycles/s"),
}


class Unsupported(Exception):
    """The peer cannot run this workload (the message says why)."""


@dataclass
class Handle:
    """A buffer of one peer, seen through the operations the workloads time."""

    extend: Callable[[Any], object]
    sample: Callable[[int], object]
    #: priorities of slots ``start .. start + len(p) - 1`` (prioritized buffers)
    prioritize: Callable[[int, np.ndarray], None] | None = None
    #: one sample(B) + update of the B priorities (prioritized buffers)
    cycle: Callable[[int, Any], None] | None = None


# ------------------------------------------------------------------------------------------
# Rows
# ------------------------------------------------------------------------------------------


def tiny_batch(n: int) -> TensorDict:
    """33-byte rows: ``obs[8]`` float32 and ``done[1]`` bool."""
    return TensorDict({"obs": torch.randn(n, 8), "done": torch.zeros(n, 1, dtype=torch.bool)},
                      batch_size=[n])


def episode_batch(start: int, n: int) -> TensorDict:
    """Transition rows of global steps ``start ..``, with an int32 trajectory id."""
    td = transition_batch(n)
    td["episode"] = (torch.arange(start, start + n) // TRAJ_LEN).to(torch.int32)
    return td


# ------------------------------------------------------------------------------------------
# Peers
# ------------------------------------------------------------------------------------------


class Peer:
    """A library under test. A workload it cannot run raises :class:`Unsupported`."""

    name = ""

    def info(self) -> dict[str, object]:
        return {}

    def load(self) -> None:
        """Import the library before any timing: a first fill times the fill, not the import
        (tdreplay's import loads numba, about 1 s)."""

    def convert(self, td: TensorDict) -> Any:
        """``td`` in the form this peer's ``extend`` takes."""
        return td

    def uniform(self, capacity: int, example: Any) -> Handle:
        raise Unsupported(f"{self.name} has no uniform buffer")

    def prioritized(self, capacity: int, example: Any) -> Handle:
        raise Unsupported(f"{self.name} has no prioritized buffer")

    def slices(self, capacity: int, example: Any, cached: bool) -> Handle:
        raise Unsupported(f"{self.name} has no slice sampler")

    def memmap(self, capacity: int, example: Any, root: Path) -> Handle:
        raise Unsupported(f"{self.name} has no memory-mapped storage")


#: what the workloads use of ``torchrl.data``, and of ``tdreplay.data`` under the same names
CLASSES = ["ReplayBuffer", "TensorDictReplayBuffer", "PrioritizedReplayBuffer", "SliceSampler",
           "LazyTensorStorage", "LazyMemmapStorage"]


class TorchRLLike(Peer):
    """TorchRL's replay-buffer API, which tdreplay keeps (``torchrl.data`` -> ``tdreplay.data``)."""

    def classes(self) -> dict[str, Any]:
        """``CLASSES`` by name."""
        raise NotImplementedError

    def load(self) -> None:
        self.classes()

    def uniform(self, capacity: int, example: Any) -> Handle:
        c = self.classes()
        rb = c["ReplayBuffer"](storage=c["LazyTensorStorage"](capacity))
        return Handle(rb.extend, rb.sample)

    def prioritized(self, capacity: int, example: Any) -> Handle:
        c = self.classes()
        rb = c["PrioritizedReplayBuffer"](alpha=ALPHA, beta=BETA,
                                          storage=c["LazyTensorStorage"](capacity))

        def prioritize(start: int, priorities: np.ndarray) -> None:
            rb.update_priority(torch.arange(start, start + len(priorities)),
                               torch.from_numpy(priorities))

        return Handle(rb.extend, rb.sample, prioritize, self.cycle_of(rb))

    def cycle_of(self, rb: Any) -> Callable[[int, Any], None]:
        def cycle(batch: int, priorities: torch.Tensor) -> None:
            _, info = rb.sample(batch, return_info=True)
            rb.update_priority(info["index"], priorities)

        return cycle

    def slices(self, capacity: int, example: Any, cached: bool) -> Handle:
        c = self.classes()
        rb = c["TensorDictReplayBuffer"](
            storage=c["LazyTensorStorage"](capacity), batch_size=1024,
            sampler=c["SliceSampler"](num_slices=32, traj_key="episode", cache_values=cached))
        return Handle(rb.extend, lambda batch: rb.sample(batch))

    def memmap(self, capacity: int, example: Any, root: Path) -> Handle:
        c = self.classes()
        rb = c["ReplayBuffer"](storage=c["LazyMemmapStorage"](capacity, scratch_dir=root))
        return Handle(rb.extend, rb.sample)


class TdreplayPeer(TorchRLLike):
    name = "tdreplay"

    def info(self) -> dict[str, object]:
        from importlib.metadata import version

        return {"version": version("tdreplay-core"), "tensordict": version("tensordict")}

    def classes(self) -> dict[str, Any]:
        import tdreplay.data

        return {name: getattr(tdreplay.data, name) for name in CLASSES}

    def cycle_of(self, rb: Any) -> Callable[[int, Any], None]:
        def cycle(batch: int, priorities: torch.Tensor) -> None:
            # as a learner does: rows overwritten since the sample keep their new priority
            _, info = rb.sample(batch, return_info=True)
            rb.update_priority(info["index"], priorities,
                               write_generation=info["write_generation"])

        return cycle


class TorchRLPeer(TorchRLLike):
    name = "torchrl"

    def info(self) -> dict[str, object]:
        import tensordict
        import torchrl

        return {"version": torchrl.__version__, "tensordict": tensordict.__version__}

    def classes(self) -> dict[str, Any]:
        import torchrl.data

        return {name: getattr(torchrl.data, name) for name in CLASSES}

    def prioritized(self, capacity: int, example: Any) -> Handle:
        try:
            return super().prioritized(capacity, example)
        except RuntimeError as err:  # its C++ segment trees do not load against this torch
            raise Unsupported(f"torchrl's PrioritizedReplayBuffer: {err} (torchrl's C++ "
                              f"extension does not load against torch {torch.__version__})"
                              ) from err


def flat_tensors(td: TensorDict) -> dict[str, torch.Tensor]:
    """``{"obs": ..., "next_obs": ...}``: the leaves of ``td`` under flat names."""
    return dict(td.flatten_keys("_").items())


def empty_views(capacity: int, leaves: Iterable[torch.Tensor]) -> list[np.ndarray]:
    """Numpy views of new ``torch.empty`` tensors of ``capacity`` rows shaped and typed as
    ``leaves`` (one per leaf): the floors' storage, allocated at the first write."""
    return [torch.empty((capacity, *t.shape[1:]), dtype=t.dtype).numpy() for t in leaves]


class FloorPeer(Peer):
    """Bare torch on preallocated tensors: what no buffer built on this torch can beat.

    Rows are read and written through numpy views of the tensors' memory, made once at
    allocation: ``ndarray.take`` to gather whole rows (the method: the ``numpy.take``
    function's dispatch costs 2-3 us per leaf more) and a slice assignment to write. On one
    CPU thread both are faster than torch's own ops: ``torch.index_select`` copies element by
    element (at 1M rows, B=4096 about 1.7x slower), and a slice ``copy_`` costs a dispatch per
    leaf (five leaves of 1,000 rows: about 50 against 43 us). A floor built on the slower
    ops would not be one.
    """

    name = "floor"

    def info(self) -> dict[str, object]:
        return {"version": torch.__version__,
                "what": "torch.empty storage seen through numpy views made once: slice "
                        "assignment to write, randint + take of the rows to read"}

    def convert(self, td: TensorDict) -> dict[str, torch.Tensor]:
        return flat_tensors(td)

    def uniform(self, capacity: int, example: dict[str, torch.Tensor]) -> Handle:
        views: dict[str, np.ndarray] = {}
        state = {"cursor": 0, "size": 0}

        def extend(batch: dict[str, torch.Tensor]) -> None:
            if not views:  # allocated at the first write, as a lazy storage is
                views.update(zip(batch, empty_views(capacity, batch.values())))
            n = len(next(iter(batch.values())))
            start = state["cursor"]  # the workloads' chunks divide the capacity: no wrap
            for key, t in batch.items():
                views[key][start:start + n] = t.numpy()
            state["cursor"] = (start + n) % capacity
            state["size"] = min(state["size"] + n, capacity)

        def sample(batch: int) -> dict[str, torch.Tensor]:
            idx = torch.randint(state["size"], (batch,)).numpy()
            return {key: torch.from_numpy(view.take(idx, 0)) for key, view in views.items()}

        return Handle(extend, sample)


class FloorTensorDictPeer(Peer):
    """The floor behind TorchRL's interface: a TensorDict in, the slots written out, a
    TensorDict sampled. Counted by ``instructions.py`` (not timed by ``peers_run.py``): what the
    interface itself costs over the bare floor, so that tdreplay's overhead over the floor
    splits into that and what tdreplay's own layers add.

    Nothing more than the interface asks: the leaves of the batch are walked level by level
    (``TensorDict.items``; nothing is checked), written as the floor writes them, and the
    slots written returned as an int64 tensor; a sample gathers as the floor does and builds
    the nested TensorDict with tensordict's unchecked constructor (the one its own indexing
    uses), on the CPU as a CPU storage's samples are.
    """

    name = "floor_td"

    def info(self) -> dict[str, object]:
        return {"version": torch.__version__,
                "what": "the floor, with a TensorDict in and out and the slots returned"}

    def uniform(self, capacity: int, example: TensorDict) -> Handle:
        views: list[np.ndarray] = []
        state = {"cursor": 0, "size": 0}
        cpu = torch.device("cpu")

        def leaves_of(td: TensorDict, out: list[torch.Tensor]) -> list[torch.Tensor]:
            for value in td.values():
                if type(value) is TensorDict:
                    leaves_of(value, out)
                else:
                    out.append(value)
            return out

        def positions(td: TensorDict, leaf: Iterator[int]) -> dict[str, Any]:
            """``{name: position of its leaf in leaves_of(td), or the same of a level}``."""
            return {name: positions(value, leaf) if type(value) is TensorDict else next(leaf)
                    for name, value in td.items()}

        shape = positions(example, itertools.count())

        def build(level: dict[str, Any], leaves: list[torch.Tensor],
                  batch_size: torch.Size) -> TensorDict:
            source = {name: build(sub, leaves, batch_size) if type(sub) is dict
                      else leaves[sub] for name, sub in level.items()}
            return TensorDict._new_unsafe(source=source, batch_size=batch_size,  # noqa: SLF001
                                          device=cpu, nested=False)

        def extend(batch: TensorDict) -> torch.Tensor:
            leaves = leaves_of(batch, [])
            if not views:  # allocated at the first write, as a lazy storage is
                views.extend(empty_views(capacity, leaves))
            n = batch.batch_size[0]
            start = state["cursor"]  # the workloads' chunks divide the capacity: no wrap
            for view, t in zip(views, leaves):
                view[start:start + n] = t.numpy()
            state["cursor"] = (start + n) % capacity
            state["size"] = min(state["size"] + n, capacity)
            return torch.from_numpy(np.arange(start, start + n))

        def sample(batch: int) -> TensorDict:
            idx = torch.randint(state["size"], (batch,)).numpy()
            leaves = [torch.from_numpy(view.take(idx, 0)) for view in views]
            return build(shape, leaves, torch.Size([batch]))

        return Handle(extend, sample)


class CpprbPeer(Peer):
    name = "cpprb"

    def info(self) -> dict[str, object]:
        from importlib.metadata import version

        return {"version": version("cpprb"), "numpy": np.__version__}

    def load(self) -> None:
        import cpprb  # noqa: F401

    def convert(self, td: TensorDict) -> dict[str, np.ndarray]:
        return {key: t.numpy() for key, t in flat_tensors(td).items()}

    @staticmethod
    def env_dict(example: dict[str, np.ndarray]) -> dict[str, dict[str, object]]:
        return {key: {"shape": a.shape[1:], "dtype": a.dtype} for key, a in example.items()}

    def uniform(self, capacity: int, example: dict[str, np.ndarray]) -> Handle:
        import cpprb

        rb = cpprb.ReplayBuffer(capacity, self.env_dict(example))
        return Handle(lambda batch: rb.add(**batch), rb.sample)

    def prioritized(self, capacity: int, example: dict[str, np.ndarray]) -> Handle:
        import cpprb

        rb = cpprb.PrioritizedReplayBuffer(capacity, self.env_dict(example), alpha=ALPHA)

        def prioritize(start: int, priorities: np.ndarray) -> None:
            rb.update_priorities(np.arange(start, start + len(priorities)), priorities)

        def cycle(batch: int, priorities: np.ndarray) -> None:
            sample = rb.sample(batch, beta=BETA)
            rb.update_priorities(sample["indexes"], priorities)

        return Handle(lambda batch: rb.add(**batch), rb.sample, prioritize, cycle)


PEERS: dict[str, type[Peer]] = {p.name: p for p in (TdreplayPeer, FloorPeer, FloorTensorDictPeer,
                                                    CpprbPeer, TorchRLPeer)}


# ------------------------------------------------------------------------------------------
# Timing
# ------------------------------------------------------------------------------------------


def load() -> float:
    return round(os.getloadavg()[0], 2)


def measure(fn: Callable[[], object], seconds: float, repeats: int = 3
            ) -> tuple[float, list, float]:
    """(median, all, by CPU time) calls per second of ``fn`` over ``repeats`` windows of
    ``_common.rate``. The last figure counts this process's CPU time instead of the wall clock:
    other processes of a shared machine take wall time, not this process's CPU time."""
    calls = [0]

    def counted() -> None:
        fn()
        calls[0] += 1

    cpu = time.process_time()
    runs = [rate(counted, min_time=seconds / repeats) for _ in range(repeats)]
    by_cpu = calls[0] / max(time.process_time() - cpu, 1e-9)
    return statistics.median(runs), runs, by_cpu


def once(fn: Callable[[], object], repeats: int = 3) -> tuple[float, list, float]:
    """As :func:`measure`, for a one-off ``fn`` (e.g. a first fill): ``repeats`` calls timed
    one at a time."""
    cpu = time.process_time()
    runs = [rate(fn, min_time=0.0, warmup=0) for _ in range(repeats)]
    return statistics.median(runs), runs, repeats / max(time.process_time() - cpu, 1e-9)


def skipped(name: str, reason: str, **extra: object) -> None:
    print(json.dumps({"name": name, "skipped": reason, **extra}), flush=True)


def cycling(items: list) -> Iterator:
    return itertools.cycle(items)


def run(names: list[str], body: Callable[[], None], **extra: object) -> None:
    """Run the workloads ``names`` (``body``), reported as skipped if the peer cannot run them."""
    try:
        body()
    except Unsupported as why:
        for name in names:
            skipped(name, str(why), **extra)
    finally:
        gc.collect()


def report_rate(name: str, result: tuple[float, list, float], scale: float = 1.0,
                **extra: object) -> None:
    value, runs, by_cpu = result
    report(name, value * scale, METRICS[name][1], runs=[round(r * scale, 1) for r in runs],
           cpu_rate=round(by_cpu * scale, 1), loadavg_1m=load(),
           threads=torch.get_num_threads(), **extra)


# ------------------------------------------------------------------------------------------
# Workloads
# ------------------------------------------------------------------------------------------


def chunks_of(peer: Peer, n: int, count: int = 4) -> Iterator:
    """``count`` different transition batches of ``n`` rows in the peer's form, in turn."""
    return cycling([peer.convert(transition_batch(n)) for _ in range(count)])


def fill(handle: Handle, chunks: Iterator, rows: int, chunk: int) -> None:
    for _ in range(rows // chunk):
        handle.extend(next(chunks))


def uniform_workloads(peer: Peer, seconds: float) -> None:
    chunks = chunks_of(peer, 10_000)
    example = next(chunks)

    def first_fill() -> None:
        fill(peer.uniform(CAPACITY, example), chunks, CAPACITY, 10_000)

    run(["first_fill_10k"], lambda: report_rate("first_fill_10k", once(first_fill), CAPACITY))
    rb = peer.uniform(CAPACITY, example)
    fill(rb, chunks, CAPACITY, 10_000)
    report_rate("extend_10k_full", measure(lambda: rb.extend(next(chunks)), seconds), 10_000)
    small = chunks_of(peer, 1_000)
    report_rate("extend_1k", measure(lambda: rb.extend(next(small)), seconds))
    for batch in (256, 4096):
        report_rate(f"sample_{batch}", measure(lambda: rb.sample(batch), seconds))


def priorities(peer: Peer, batch: int) -> Iterator:
    """Four arrays of ``batch`` random priorities, in the peer's form, in turn."""
    arrays = [np.random.rand(batch).astype(np.float32) + 0.01 for _ in range(4)]
    return cycling(arrays if isinstance(peer, CpprbPeer) else
                   [torch.from_numpy(a) for a in arrays])


def cycles(name: str, rb: Handle, peer: Peer, seconds: float, **extra: object) -> None:
    for batch in (256, 4096):
        prio = priorities(peer, batch)
        report_rate(f"{name}{batch}", measure(lambda: rb.cycle(batch, next(prio)), seconds),
                    batch=batch, **extra)


def prioritized_buffer(peer: Peer, capacity: int) -> Handle:
    """The peer's prioritized buffer of ``capacity`` slots, filled with extends of 100,000 rows
    (the whole capacity, if smaller), every slot then given a random priority."""
    chunk = min(capacity, 100_000)
    chunks = chunks_of(peer, chunk, count=2)
    rb = peer.prioritized(capacity, next(chunks))
    fill(rb, chunks, capacity, chunk)
    assert rb.prioritize is not None
    rb.prioritize(0, np.random.rand(capacity).astype(np.float32) + 0.01)
    return rb


def prioritized_workloads(peer: Peer, seconds: float) -> None:
    def body() -> None:
        cycles("prioritized_cycle_B", prioritized_buffer(peer, CAPACITY), peer, seconds)

    run(["prioritized_cycle_B256", "prioritized_cycle_B4096"], body)


def slice_workloads(peer: Peer, seconds: float) -> None:
    for name, cached in (("slices_32x32", False), ("slices_32x32_cached", True)):
        def body(cached: bool = cached, name: str = name) -> None:
            example = peer.convert(episode_batch(0, 10))
            rb = peer.slices(CAPACITY, example, cached)
            for start in range(0, CAPACITY, 100_000):
                rb.extend(peer.convert(episode_batch(start, 100_000)))
            report_rate(name, measure(lambda: rb.sample(1024), seconds), cache_values=cached)

        run([name], body)


def memmap_workloads(peer: Peer, seconds: float, root: Path) -> None:
    chunks = chunks_of(peer, 10_000)
    example = next(chunks)
    dirs = itertools.count()

    def scratch() -> Path:
        shutil.rmtree(root, ignore_errors=True)  # one buffer's files on disk at a time
        path = root / f"memmap-{next(dirs)}"
        path.mkdir(parents=True)
        return path

    def first_fill() -> None:
        fill(peer.memmap(CAPACITY, example, scratch()), chunks, CAPACITY, 10_000)

    def body() -> None:
        report_rate("memmap_first_fill_10k", once(first_fill), CAPACITY)
        rb = peer.memmap(CAPACITY, example, scratch())
        fill(rb, chunks, CAPACITY, 10_000)
        report_rate("memmap_extend_10k_full", measure(lambda: rb.extend(next(chunks)), seconds),
                    10_000)
        report_rate("memmap_sample_256", measure(lambda: rb.sample(256), seconds))

    run(["memmap_first_fill_10k", "memmap_extend_10k_full", "memmap_sample_256"], body)
    shutil.rmtree(root, ignore_errors=True)


def available_bytes() -> int:
    """MemAvailable of ``/proc/meminfo`` (what can be had now without swapping)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def fits(rows: int, per_slot: int) -> tuple[bool, str]:
    need = int(rows * per_slot * 1.25) + 2**30  # and room for temporaries
    have = available_bytes()
    return need <= have, f"needs ~{need / 2**30:.1f} GiB, {have / 2**30:.1f} GiB available"


UNIFORM_SCALING = ["scaling/uniform_sample_256", "scaling/uniform_sample_4096"]
PRIORITIZED_SCALING = ["scaling/prioritized_cycle_B256", "scaling/prioritized_cycle_B4096"]


def scaling_workloads(peer: Peer, seconds: float, sizes: list[int]) -> None:
    chunk = peer.convert(tiny_batch(SCALING_CHUNK))
    chunks = cycling([chunk])
    for rows in sizes:
        ok, why = fits(rows, TINY_ROW_BYTES)
        if not ok:
            for name in UNIFORM_SCALING:
                skipped(name, why, rows=rows)
        else:
            def uniform(rows: int = rows) -> None:
                rb = peer.uniform(rows, chunk)
                fill(rb, chunks, rows, SCALING_CHUNK)
                for batch in (256, 4096):
                    report_rate(f"scaling/uniform_sample_{batch}",
                                measure(lambda: rb.sample(batch), seconds), rows=rows,
                                batch=batch)

            run(UNIFORM_SCALING, uniform, rows=rows)
        ok, why = fits(rows, TINY_ROW_BYTES + PRIORITY_BYTES_PER_SLOT)
        if not ok:
            for name in PRIORITIZED_SCALING:
                skipped(name, why, rows=rows)
            continue

        def prioritized(rows: int = rows) -> None:
            rb = peer.prioritized(rows, chunk)
            fill(rb, chunks, rows, SCALING_CHUNK)
            cycles("scaling/prioritized_cycle_B", rb, peer, seconds, rows=rows)

        run(PRIORITIZED_SCALING, prioritized, rows=rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("peer", choices=sorted(PEERS))
    parser.add_argument("--quick", action="store_true",
                        help=f"scaling sizes {QUICK_SIZES} instead of {SCALING_SIZES}")
    parser.add_argument("--seconds", type=float, default=1.5, help="timing per measurement")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--sizes", type=int, nargs="*", default=None,
                        help="buffer sizes of the scaling runs (overrides --quick)")
    parser.add_argument("--dir", type=Path, default=None, help="where memmap files go")
    parser.add_argument("--only", nargs="*", default=None,
                        help="workload groups: uniform prioritized slices memmap scaling")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    np.random.seed(0)
    peer = PEERS[args.peer]()
    peer.load()
    print(json.dumps({"peer_info": {"peer": peer.name, "torch": torch.__version__,
                                    "threads": torch.get_num_threads(), **peer.info()}}),
          flush=True)
    root = Path(tempfile.mkdtemp(prefix=f"tdreplay-peers-{peer.name}-", dir=args.dir))
    groups = {
        "uniform": lambda: uniform_workloads(peer, args.seconds),
        "prioritized": lambda: prioritized_workloads(peer, args.seconds),
        "slices": lambda: slice_workloads(peer, args.seconds),
        "memmap": lambda: memmap_workloads(peer, args.seconds, root),
        "scaling": lambda: scaling_workloads(
            peer, args.seconds, args.sizes or (QUICK_SIZES if args.quick else SCALING_SIZES)),
    }
    try:
        for group, body in groups.items():
            if args.only is None or group in args.only:
                body()
                gc.collect()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
