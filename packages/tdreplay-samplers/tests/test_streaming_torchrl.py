"""``StreamingSliceSampler`` serves TorchRL's windows: 40 seeded histories of writes (done
flags, trajectory ids, ``is_init`` resets, the ring wrapping) and samples were run through
TorchRL 0.14.1 (``data/make_streaming_windows_fixture.py``); at every sample tdreplay serves the
same windows first, in the same order, and keeps the same ones queued."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.samplers import StreamingSliceSampler
from tdreplay.storages import LazyTensorStorage

HISTORIES = json.loads(
    (Path(__file__).parent / "data" / "streaming_windows_torchrl.json").read_text())


def _queued_fresh(sampler):
    """The queued windows whose slots still hold them, oldest first (from the state)."""
    state = sampler.state_dict()
    versions = state["slot_versions"]
    return [w.tolist() for w, v in zip(state["queued_indices"], state["queued_versions"])
            if torch.equal(versions[w], v)]


def _write(op):
    count = len(op["value"])
    td = TensorDict({"value": torch.tensor(op["value"]),
                     ("next", "done"): torch.tensor(op["done"]).view(-1, 1)}, [count])
    if "episode" in op:
        td["episode"] = torch.tensor(op["episode"])
    if "is_init" in op:
        td["is_init"] = torch.tensor(op["is_init"]).view(-1, 1)
    return td


@pytest.mark.parametrize("history", HISTORIES, ids=[f"seed{h['seed']}" for h in HISTORIES])
def test_windows_match_torchrl(history):
    sampler = StreamingSliceSampler(**history["kwargs"])
    length = history["kwargs"]["slice_len"]
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(history["capacity"]), sampler=sampler,
                                generator=torch.Generator().manual_seed(history["seed"]))
    for op in history["ops"]:
        if op["op"] == "extend":
            rb.extend(_write(op))
            continue
        first = op["first"]
        index = rb.sample(op["num_slices"] * length)["index"]
        assert index[: len(first) * length].view(-1, length).tolist() == first
        assert _queued_fresh(sampler) == op["left"]
