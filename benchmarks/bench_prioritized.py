"""Prioritized replay: one ``sample(B)`` + ``update_priority(B)`` cycle on a 1,000,000-slot buffer.

Buffers hold small rows (``obs[4]``, ``reward[1]``) in a ``LazyTensorStorage``; every slot is
written and has a random priority. A cycle is what a learner step does with the buffer:

- ``buffer``: ``PrioritizedReplayBuffer.sample(B, return_info=True)`` then
  ``update_priority(index, priority, write_generation=...)``;
- ``tdbuffer``: ``TensorDictPrioritizedReplayBuffer.sample(B)``, set ``td_error``, then
  ``update_tensordict_priority(sample)``;
- ``sampler``: the sampler alone (``sample`` + ``update_priority``), without reading rows.

Cases: numba trees on CPU for B = 256, 4096 and 65,536 (a sample or an update of 65,536 is split
over torch's intra-op threads: compare ``--threads 1`` with more); torch trees on CPU for
B = 65,536; and, when CUDA is available, an all-CUDA buffer (storage and trees) for B = 65,536
(the reference example). Issue 4 targets on CPU: B=256 >= 8,000 cycles/s, B=4096 >= 1,000 cycles/s.
Each result is one JSON line (see ``_common.report``): ``value`` in cycles per wall-clock second
and ``cpu_cycles_per_s`` per CPU second of the process (steadier on a shared machine).
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections.abc import Callable, Iterator

import numpy as np
import torch
from _common import device_sync, rate, report
from tensordict import TensorDict

from tdreplay.samplers import PrioritizedReplayBuffer, TensorDictPrioritizedReplayBuffer
from tdreplay.storages import LazyTensorStorage

CAPACITY = 1_000_000


def rates(fn: Callable[[], None], min_time: float) -> tuple[float, float]:
    """(calls per wall-clock second, calls per CPU second of this process).

    The second figure is the one to compare on a shared machine: other processes take wall time
    but not this process's CPU time (they still pollute its caches).
    """
    calls = [0]

    def counted() -> None:
        fn()
        calls[0] += 1

    for _ in range(3):  # compile the kernels before either clock starts
        fn()
    cpu_start = time.process_time()
    wall = rate(counted, min_time=min_time)
    return wall, calls[0] / (time.process_time() - cpu_start)


def filled(buffer_cls: type, device: str, backend: str | None) -> PrioritizedReplayBuffer:
    """A buffer with every slot written and random priorities."""
    rb = buffer_cls(alpha=0.7, beta=0.5, storage=LazyTensorStorage(CAPACITY, device=device),
                    sampler_backend=backend)
    gen = torch.Generator().manual_seed(0)
    chunk = 100_000
    for _ in range(CAPACITY // chunk):
        rb.extend(TensorDict({"obs": torch.randn(chunk, 4, generator=gen),
                              "reward": torch.randn(chunk, 1, generator=gen)},
                             [chunk], device=device))
    rb.update_priority(torch.arange(CAPACITY, device=device),
                       torch.rand(CAPACITY, generator=gen).to(device) + 0.01)
    rb.set_rng(torch.Generator(device=rb.sampler.device).manual_seed(1))
    return rb


Cycle = Callable[[], None]


def state_bytes_per_slot(rb: PrioritizedReplayBuffer) -> float:
    """Bytes per slot the sampler keeps besides the rows: the sum tree, the min tree (its
    internal nodes only: it reads the sum tree's leaves) and the write generations (issue 19:
    27.2 before int32 generations, 23.17 before the min tree shared the leaves, 14.79 since;
    cpprb 21.5)."""
    state = rb.sampler._state  # benchmarks may look inside
    arrays = [state.sum_tree.nodes, state.min_tree.nodes, state.generation]
    nbytes = sum(a.nbytes if isinstance(a, np.ndarray) else a.numel() * a.element_size()
                 for a in arrays)
    return nbytes / state.capacity


def buffer_cycles(rb: PrioritizedReplayBuffer, batch: int, priorities: Iterator[torch.Tensor]
                  ) -> list[tuple[str, Cycle]]:
    """The buffer cycle and the sampler-alone cycle of a PrioritizedReplayBuffer."""

    def buffer() -> None:
        _, info = rb.sample(batch, return_info=True)
        rb.update_priority(info["index"], next(priorities),
                           write_generation=info["write_generation"])

    def sampler() -> None:
        index, info = rb.sampler.sample(rb.storage, batch)
        rb.sampler.update_priority(index, next(priorities), storage=rb.storage,
                                   write_generation=info["write_generation"])

    return [("buffer", buffer), ("sampler", sampler)]


def tdbuffer_cycles(rb: TensorDictPrioritizedReplayBuffer, batch: int,
                    priorities: Iterator[torch.Tensor]) -> list[tuple[str, Cycle]]:
    """sample + update_tensordict_priority of a TensorDictPrioritizedReplayBuffer."""

    def tdbuffer() -> None:
        sample = rb.sample(batch)
        sample["td_error"] = next(priorities)
        rb.update_tensordict_priority(sample)

    return [("tdbuffer", tdbuffer)]


def bench(buffer_cls: type, cycles: Callable[..., list[tuple[str, Cycle]]], tag: str,
          device: str, backend: str | None, batches: list[int], min_time: float) -> None:
    """Time every cycle of ``cycles`` on a filled ``buffer_cls`` for each batch size."""
    sync = device_sync(device)
    rb = filled(buffer_cls, device, backend)
    if buffer_cls is PrioritizedReplayBuffer:
        report(f"prioritized/{tag}/state_bytes_per_slot", state_bytes_per_slot(rb), "B",
               capacity=CAPACITY, backend=rb.sampler.backend)
    for batch in batches:
        priorities = itertools.cycle([torch.rand(batch, device=device) + 0.01 for _ in range(4)])
        extra = {"batch": batch, "capacity": CAPACITY, "storage": device,
                 "trees": str(rb.sampler.device), "backend": rb.sampler.backend,
                 "threads": torch.get_num_threads()}
        for name, cycle in cycles(rb, batch, priorities):

            def synced(cycle: Cycle = cycle) -> None:
                cycle()
                sync()

            wall, cpu = rates(synced, min_time)
            report(f"prioritized/{tag}/{name}_cycle_B{batch}", wall, "cycles/s",
                   cpu_cycles_per_s=round(cpu, 1), **extra)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="timing per case")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (default: torch's own choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cases = [("numba_cpu", "cpu", None, [256, 4096, 65_536]),
             ("torch_cpu", "cpu", "torch", [65_536])]
    if torch.cuda.is_available():
        cases.append(("torch_cuda", "cuda", None, [65_536]))
    for tag, device, backend, batches in cases:
        bench(PrioritizedReplayBuffer, buffer_cycles, tag, device, backend, batches, args.seconds)
        bench(TensorDictPrioritizedReplayBuffer, tdbuffer_cycles, tag, device, backend, batches,
              args.seconds)


if __name__ == "__main__":
    main()
