"""``SliceSampler(fragmented=True)`` against TorchRL 0.14.1: the histories recorded by
``data/make_fragmented_fixture.py`` (interleaved collectors, skipped steps, wrap-around
overwrites; ``strict_length``, ``pad_output``, ``init_key`` and trajectory keys varied) are
replayed on tdreplay, and every sample must hold TorchRL's slots, in TorchRL's order, and
TorchRL's info (truncated / done / terminated flags, ``init_key`` marks, padding mask), or
raise the same type of error. Both draw from torch's global generator, seeded alike."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict, unravel_key

from tdreplay.samplers import SliceSampler
from tdreplay.storages import LazyTensorStorage

HISTORIES = json.loads(
    (Path(__file__).parent / "data" / "fragmented_torchrl.json").read_text())


def _key(value: object) -> object:
    return unravel_key(tuple(value)) if isinstance(value, list) else value


def _rows(rows: list[list[int]], done: list[bool], key: object) -> TensorDict:
    step = torch.tensor([r[1] for r in rows])
    flags = torch.tensor(done).unsqueeze(-1)
    return TensorDict({key: torch.tensor([r[0] for r in rows]), "step_count": step,
                       "is_init": (step == 0).unsqueeze(-1), "reset": (step == 1).unsqueeze(-1),
                       ("next", "done"): flags, ("next", "terminated"): flags.clone()},
                      [len(rows)])


@pytest.mark.parametrize("history", HISTORIES, ids=lambda h: f"cap{h['capacity']}")
def test_samples_are_torchrls(history: dict) -> None:
    kwargs = {k: _key(v) for k, v in history["kwargs"].items()}
    sampler = SliceSampler(fragmented=True, **kwargs)
    storage = LazyTensorStorage(history["capacity"])
    key, cursor, capacity = _key(history["stored_key"]), 0, history["capacity"]
    for op in history["ops"]:
        if op["op"] == "extend":
            n = len(op["rows"])
            storage.set((torch.arange(n) + cursor) % capacity, _rows(op["rows"], op["done"], key))
            cursor = (cursor + n) % capacity
            continue
        torch.manual_seed(op["seed"])
        if "error" in op:
            with pytest.raises(Exception) as err:
                sampler.sample(storage, op["batch_size"])
            assert op["error"] in [c.__name__ for c in type(err.value).__mro__]
            continue
        index, info = sampler.sample(storage, op["batch_size"])
        assert index.tolist() == op["index"]
        expected = {_key(json.loads(k)): v for k, v in op["info"].items()}
        assert {k: v.reshape(-1).tolist() for k, v in info.items()} == expected
