"""Transforms in the sample path, and the max-value writer's extend.

Run from the repository root::

    python benchmarks/bench_transforms.py [--quick]

- ``cat_frames``: ``CatFrames(4, -3)`` on a flat batch of 256 steps of ``[1, 84, 84]`` uint8
  frames (8 slices of 32 steps), stacking both ``pixels`` and ``("next", "pixels")``.
- ``multistep``: ``MultiStep(0.99, 3)`` on a ``[32, 32]`` batch of transitions.
- ``image_pipeline``: ``ToTensorImage`` + ``Resize(64)`` on 64 ``[84, 84, 3]`` uint8 images.
- ``max_value_extend``: ``TensorDictMaxValueWriter`` on a full 100,000-row buffer, batches of
  1,000 rows with random ranks (about half of them kept).

Each line printed is a JSON object (collected by ``benchmarks/run_all.py``). Nothing is
asserted.
"""

from __future__ import annotations

import argparse

import torch
from _common import rate, report, transition_batch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.storages import LazyTensorStorage
from tdreplay.transforms import CatFrames, Compose, MultiStep, Resize, ToTensorImage
from tdreplay.writers import TensorDictMaxValueWriter


def frames_batch(steps: int = 256, slice_len: int = 32) -> TensorDict:
    done = torch.zeros(steps, 1, dtype=torch.bool)
    done[slice_len - 1:: slice_len] = True
    return TensorDict({
        "pixels": torch.randint(0, 256, (steps, 1, 84, 84), dtype=torch.uint8),
        ("next", "pixels"): torch.randint(0, 256, (steps, 1, 84, 84), dtype=torch.uint8),
        ("next", "done"): done,
    }, [steps])


def main(quick: bool) -> None:
    min_time = 0.3 if quick else 1.0

    batch = frames_batch()
    cat = CatFrames(4, -3, in_keys=["pixels", ("next", "pixels")])
    per_s = rate(lambda: cat(batch.copy()), min_time=min_time)
    report("cat_frames_N4_256x1x84x84", per_s * 256, "steps/s", batches_per_s=round(per_s, 1))

    transitions = transition_batch(32 * 32).reshape(32, 32)
    transitions["next", "done"][:, 9::10] = True
    multistep = MultiStep(0.99, 3)
    per_s = rate(lambda: multistep(transitions.copy()), min_time=min_time)
    report("multistep_n3_32x32", per_s * 1024, "steps/s", batches_per_s=round(per_s, 1))

    images = TensorDict({"pixels": torch.randint(0, 256, (64, 84, 84, 3), dtype=torch.uint8)},
                        [64])
    pipeline = Compose(ToTensorImage(), Resize(64))
    per_s = rate(lambda: pipeline(images.copy()), min_time=min_time)
    report("to_tensor_resize64_64x84x84x3", per_s * 64, "images/s", batches_per_s=round(per_s, 1))

    capacity, bs = 100_000, 1_000
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(capacity),
                                writer=TensorDictMaxValueWriter(rank_key="rank"))
    rb.extend(TensorDict({"rank": torch.rand(capacity), "obs": torch.randn(capacity, 8)},
                         [capacity]))
    g = torch.Generator().manual_seed(0)

    def extend() -> None:
        # ranks drift upwards so that a steady share of each batch beats the minimum
        extend.level += 0.002
        rank = torch.rand(bs, generator=g) + extend.level
        rb.extend(TensorDict({"rank": rank, "obs": torch.randn(bs, 8, generator=g)}, [bs]))

    extend.level = 0.0
    per_s = rate(extend, min_time=min_time)
    report("max_value_extend_1k_into_100k", per_s * bs, "rows offered/s",
           batches_per_s=round(per_s, 1))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    main(parser.parse_args().quick)
