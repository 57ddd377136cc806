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


@pytest.mark.parametrize("kind", ["prioritized", "prioritized_slice"])
def test_a_storage_emptied_alone_is_sampled_after_new_writes(kind):
    # rb.storage.empty() past the buffer: the sampler still held the 32 old slots; every
    # sample raised IndexError until rb.empty()
    rb = _buffer(kind)
    rb.extend(_rows(32))
    rb.storage.empty()
    assert len(rb) == 0
    rb.extend(_rows(8, start=100))
    for _ in range(20):
        x = rb.sample()["x"]
        assert bool(((x >= 100) & (x < 108)).all())  # only the rows written since
    assert len(rb) == 8


def test_an_empty_through_the_buffer_keeps_index_errors_of_the_sampler():
    # rb.empty() tells the sampler: a sampler that later draws a slot the storage lacks is a
    # fault of the sampler, not a reset to heal from
    class OffByOne(PrioritizedSampler):
        def sample(self, storage, batch_size):
            index, info = super().sample(storage, batch_size)
            return index + len(storage), info

    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8), sampler=OffByOne(8, 0.7, 0.5),
                                batch_size=2)
    rb.extend(_rows(4))
    rb.empty()
    rb.extend(_rows(4))
    with pytest.raises(IndexError):
        rb.sample()


@pytest.mark.parametrize("kind", ["prioritized", "prioritized_slice"])
def test_a_used_sampler_set_onto_another_buffer_learns_its_storage(kind):
    # the sampler knew 32 slots of another storage: every sample of the 8-row buffer raised
    source = _buffer(kind)
    source.extend(_rows(32))
    rb = _buffer(kind)
    rb.extend(_rows(8, start=100))
    rb.set_sampler(source.sampler)
    for _ in range(20):
        x = rb.sample()["x"]
        assert bool(((x >= 100) & (x < 108)).all())
    rb.extend(_rows(4, start=200))  # later writes reach it as usual
    seen = torch.cat([rb.sample()["x"] for _ in range(40)])
    assert bool((seen >= 200).any())


def test_a_sampler_set_onto_its_own_buffer_keeps_its_priorities():
    # swapping the sampler out and back keeps what it knew (no slot it draws is missing)
    rb = _buffer("prioritized")
    rb.extend(_rows(16))
    rb.update_priority(torch.arange(16), torch.arange(1.0, 17.0))
    total = rb.sampler.total_priority
    own = rb.set_sampler(PrioritizedSampler(32, alpha=0.7, beta=0.5))
    rb.set_sampler(own)
    for _ in range(5):
        rb.sample()
    assert rb.sampler.total_priority == pytest.approx(total)
