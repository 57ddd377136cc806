"""Prioritized replay: one ``sample(B)`` + ``update_priority(B)`` cycle on a 1,000,000-slot buffer.

Buffers hold small rows (``obs[4]``, ``reward[1]``) in a ``LazyTensorStorage``; every slot is
written and has a random priority. A cycle is what a learner step does with the buffer:

- ``buffer``: ``PrioritizedReplayBuffer.sample(B, return_info=True)`` then
  ``update_priority(index, priority, write_generation=...)``;
- ``tdbuffer``: ``TensorDictPrioritizedReplayBuffer.sample(B)``, set ``td_error``, then
  ``update_tensordict_priority(sample)``;
- ``sampler``: the sampler alone (``sample`` + ``update_priority``), without reading rows.

Cases: numba trees on CPU for B = 256 and 4096; torch trees on CPU for B = 65,536; and, when
CUDA is available, an all-CUDA buffer (storage and trees) for B = 65,536 (the reference
example). Issue 4 targets on CPU: B=256 >= 8,000 cycles/s, B=4096 >= 1,000 cycles/s.
Each result is one JSON line (see ``_common.report``).
"""

from __future__ import annotations

import argparse

import torch
from _common import rate, report
from tdreplay.samplers import PrioritizedReplayBuffer, TensorDictPrioritizedReplayBuffer
from tdreplay.storages import LazyTensorStorage
from tensordict import TensorDict

CAPACITY = 1_000_000


def filled(buffer_cls: type, device: str, backend: str | None) -> PrioritizedReplayBuffer:
    """A buffer with every slot written and random priorities."""
    rb = buffer_cls(alpha=0.7, beta=0.5, storage=LazyTensorStorage(CAPACITY, device=device),
                    sampler_backend=backend)
    gen = torch.Generator().manual_seed(0)
    chunk = 100_000
    for start in range(0, CAPACITY, chunk):
        rb.extend(TensorDict({"obs": torch.randn(chunk, 4, generator=gen),
                              "reward": torch.randn(chunk, 1, generator=gen)},
                             [chunk], device=device))
    rb.update_priority(torch.arange(CAPACITY, device=device),
                       torch.rand(CAPACITY, generator=gen).to(device) + 0.01)
    rb.set_rng(torch.Generator(device=rb.sampler.device).manual_seed(1))
    return rb


def cycles(device: str, backend: str | None, batch: int, min_time: float, tag: str) -> None:
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    priorities = [torch.rand(batch, device=device) + 0.01 for _ in range(4)]
    extra = {"batch": batch, "capacity": CAPACITY, "storage": device,
             "trees": None, "backend": None}

    rb = filled(PrioritizedReplayBuffer, device, backend)
    extra.update(trees=str(rb.sampler.device), backend=rb.sampler.backend)
    it = [0]

    def buffer_cycle() -> None:
        _, info = rb.sample(batch, return_info=True)
        it[0] += 1
        rb.update_priority(info["index"], priorities[it[0] % 4],
                           write_generation=info["write_generation"])

    def sampler_cycle() -> None:
        index, info = rb.sampler.sample(rb.storage, batch)
        it[0] += 1
        rb.sampler.update_priority(index, priorities[it[0] % 4], storage=rb.storage,
                                   write_generation=info["write_generation"])

    def timed(fn):  # noqa: ANN001, ANN202 - local helper
        def step() -> None:
            fn()
            sync()
        return step

    report(f"prioritized/{tag}/buffer_cycle_B{batch}", rate(timed(buffer_cycle), min_time=min_time),
           "cycles/s", **extra)
    report(f"prioritized/{tag}/sampler_cycle_B{batch}",
           rate(timed(sampler_cycle), min_time=min_time), "cycles/s", **extra)
    del rb

    tdrb = filled(TensorDictPrioritizedReplayBuffer, device, backend)

    def td_cycle() -> None:
        sample = tdrb.sample(batch)
        it[0] += 1
        sample["td_error"] = priorities[it[0] % 4]
        tdrb.update_tensordict_priority(sample)

    report(f"prioritized/{tag}/tdbuffer_cycle_B{batch}", rate(timed(td_cycle), min_time=min_time),
           "cycles/s", **extra)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="timing per case")
    args = parser.parse_args()
    for batch in (256, 4096):
        cycles("cpu", None, batch, args.seconds, "numba_cpu")
    cycles("cpu", "torch", 65_536, args.seconds, "torch_cpu")
    if torch.cuda.is_available():
        cycles("cuda", None, 65_536, args.seconds, "torch_cuda")


if __name__ == "__main__":
    main()
