"""A storage restored past its buffer (``rb.storage.load_state_dict`` / ``rb.storage.loads``,
as TorchRL programs do) under a prioritized sampler: the sampler drew slots the storage no
longer held and every later sample raised ``IndexError`` (50 of 50, new writes too). The
buffer now has its sampler learn the written slots anew when that happens (as after a restore
through another buffer of the storage); a sampler restored with the storage keeps its state."""

from __future__ import annotations

import copy

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.samplers import PrioritizedSampler, PrioritizedSliceSampler
from tdreplay.storages import LazyTensorStorage


def _rows(n: int, start: int = 0) -> TensorDict:
    x = torch.arange(start, start + n, dtype=torch.float32)
    return TensorDict({"x": x, "episode": (x // 4).long()}, [n])


def _buffer(kind: str) -> TensorDictReplayBuffer:
    sampler = PrioritizedSampler(32, alpha=0.7, beta=0.5) if kind == "prioritized" \
        else PrioritizedSliceSampler(32, alpha=0.7, beta=0.5, slice_len=2, traj_key="episode")
    return TensorDictReplayBuffer(storage=LazyTensorStorage(32), sampler=sampler, batch_size=6,
                                  generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("kind", ["prioritized", "prioritized_slice"])
@pytest.mark.parametrize("how", ["state_dict", "loads"])
def test_a_shorter_storage_restored_alone_is_sampled(kind, how, tmp_path):
    rb = _buffer(kind)
    rb.extend(_rows(16))
    if how == "loads":
        rb.storage.dumps(tmp_path / "storage")
    old = copy.deepcopy(rb.storage.state_dict())
    rb.extend(_rows(16, start=100))  # 32 rows: the sampler knows slots up to 31
    if how == "loads":
        rb.storage.loads(tmp_path / "storage")
    else:
        rb.storage.load_state_dict(old)
    assert len(rb) == 16
    for _ in range(20):
        assert bool((rb.sample()["x"] < 16).all())  # only rows the storage holds
    rb.extend(_rows(4, start=200))
    assert rb.sample()["index"].max() < 20


def test_a_sampler_restored_with_its_storage_keeps_its_priorities():
    rb = _buffer("prioritized")
    rb.extend(_rows(16))
    rb.update_priority(torch.arange(16), torch.arange(1.0, 17.0))
    saved = copy.deepcopy(rb.state_dict())
    rb.extend(_rows(16, start=100))
    rb.storage.load_state_dict(saved["_storage"])  # component by component, as TorchRL's
    rb.sampler.load_state_dict(saved["_sampler"])
    assert rb.sampler.max_priority == pytest.approx(16.0)
    assert rb.sampler.total_priority == pytest.approx(sum((p + 1e-8) ** 0.7
                                                          for p in range(1, 17)), rel=1e-6)
    for _ in range(5):
        assert bool((rb.sample()["x"] < 16).all())
