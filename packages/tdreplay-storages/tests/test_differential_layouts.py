"""Differential fuzzing of multi-dimensional storage layouts.

``LazyTensorStorage(N, ndim=2)`` / ``LazyMemmapStorage(N, ndim=2)`` get ``[B, T]`` batches
of varying ``T`` (default ``dim_extend``: along ``T``; ``dim_extend=0``: ``[T, B]`` batches).
A model of TorchRL's layout (docs/guides/migrating.rst "Slice samplers": one storage row per
step, each environment's steps run down the rows across writes, the rows a ring) is compared
after every step with ``rb[:]``, ``len``, ``write_count``, the slots ``extend`` returns, and
with samples (their ``index`` must point at the rows they returned), also after restores.
"""

from __future__ import annotations

import random

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.core.testing import restored
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage


def run(seed, keep):
    rng = random.Random(seed)
    lanes, rows = rng.randint(1, 3), rng.randint(2, 6)
    cls = rng.choice([LazyTensorStorage, LazyMemmapStorage])
    dim0 = rng.random() < 0.5
    kwargs = {"dim_extend": 0} if dim0 else {}

    def make():
        return TensorDictReplayBuffer(storage=cls(rows * lanes, ndim=2), batch_size=4,
                                      **kwargs)

    rb = make()
    model = [[None] * lanes for _ in range(rows)]  # [row][lane]
    steps, uid = 0, 0
    for _ in range(8):
        if rng.random() < 0.2 and steps:
            rb = restored(rb, make, rng.choice(["state_dict", "dumps", "pickle", "deepcopy"]),
                          keep)
        else:
            t = rng.randint(1, rows + 1)
            x = torch.arange(uid, uid + lanes * t).reshape(lanes, t)
            uid += lanes * t
            data = TensorDict({"x": x.T.contiguous() if dim0 else x},
                              [t, lanes] if dim0 else [lanes, t])
            slots = torch.as_tensor(rb.extend(data))
            want = []
            for j in range(t):
                r = (steps + j) % rows
                for b in range(lanes):
                    model[r][b] = int(x[b, j])
                want.append([r * lanes + b for b in range(lanes)])
            want = torch.tensor(want)
            assert torch.equal(slots.reshape(-1), (want if dim0 else want.T).reshape(-1)), seed
            steps += t
        filled = min(steps, rows)
        assert len(rb) == filled * lanes
        stored = rb.storage[:]["x"]
        assert stored.tolist() == model[:filled], seed
        batch = rb.sample()
        assert torch.equal(batch["x"], stored.reshape(-1)[batch["index"]]), seed
        assert torch.equal(rb.storage.get(batch["index"])["x"], batch["x"]), seed


@pytest.mark.parametrize("block", range(4))
def test_ndim2_layout_matches_model(block):
    keep: list = []
    for seed in range(block * 5, block * 5 + 5):
        run(seed, keep)
