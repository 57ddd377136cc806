"""Odd values and states of another buffer, refused before anything changes (issue 18 items 6,
7, 8, 12): finite priorities that overflow once raised to ``alpha``, priority shapes that do
not pair with the index, lossy casts into tensor storages, and states or checkpoints of a
bigger tensor-storage buffer. After each refusal the buffer holds what it held (rows, counters,
priorities, generator), a lazy storage stays unlaid, and a checkpoint saves and loads.
"""

from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import CheckpointError, TensorDictReplayBuffer
from tdreplay.samplers import PrioritizedSampler
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage

CAPACITY = 16


def storage_of(kind: str, tmp_path, capacity: int = CAPACITY, name: str = "s"):
    if kind == "memmap":
        return LazyMemmapStorage(capacity, scratch_dir=tmp_path / f"{name}-{capacity}")
    return LazyTensorStorage(capacity)


def rows(start: int, n: int = 5) -> TensorDict:
    i = torch.arange(start, start + n)
    return TensorDict({"obs": i.float().unsqueeze(-1).expand(n, 3).clone(), "i": i,
                       "done": i % 3 == 0}, [n])


def fingerprint(rb: TensorDictReplayBuffer) -> tuple:
    state = rb.state_dict()
    sampler = state["_sampler"]
    return (rb.storage[:]["i"].tolist() if len(rb) else [], rb.write_count,
            rb.writer.state_dict(), state["_rng"],
            sampler["priorities"].clone() if "priorities" in sampler else None,
            sampler.get("max_priority"))


def assert_unchanged(rb: TensorDictReplayBuffer, before: tuple) -> None:
    after = fingerprint(rb)
    assert after[:3] == before[:3]
    assert torch.equal(after[3], before[3])
    assert (after[4] is None and before[4] is None) or torch.equal(after[4], before[4])
    assert after[5] == before[5]


def roundtrip(rb: TensorDictReplayBuffer, make, path) -> None:
    """``rb`` saves, and a fresh buffer loads exactly it (rows, priorities)."""
    rb.dumps(path)
    again = make()
    again.loads(path)
    assert again.storage[:]["i"].tolist() == rb.storage[:]["i"].tolist()
    a, b = again.state_dict()["_sampler"], rb.state_dict()["_sampler"]
    if "priorities" in a:
        assert torch.equal(a["priorities"], b["priorities"])


@pytest.mark.parametrize("backend", ["numba", "torch"])
def test_overflowing_priorities_are_refused(tmp_path, tally, backend):
    def make():
        return TensorDictReplayBuffer(
            storage=LazyTensorStorage(CAPACITY), batch_size=4,
            sampler=PrioritizedSampler(CAPACITY, alpha=2.0, beta=1.0, backend=backend),
            generator=torch.Generator().manual_seed(0))

    rb = make()
    rb.extend(rows(0, 8))
    rb.update_priority(torch.arange(8), torch.arange(1.0, 9.0))
    before = fingerprint(rb)
    f64 = torch.float64
    bad = [
        (torch.tensor([0, 1]), torch.tensor([2.0, 1e200], dtype=f64)),   # 1e400 after alpha
        (torch.tensor([2]), torch.tensor([1.4e154], dtype=f64)),         # just over the max
        (torch.tensor([3, 4]), torch.tensor([1e300, 3.0], dtype=f64)),
    ]
    for index, priority in bad:
        with pytest.raises(ValueError, match="overflows"):
            rb.update_priority(index, priority)
        assert_unchanged(rb, before)
    # a sum-reduced row of finite values whose sum overflows
    summed = TensorDictReplayBuffer(
        storage=LazyTensorStorage(CAPACITY), batch_size=4,
        sampler=PrioritizedSampler(CAPACITY, alpha=1.0, beta=1.0, reduction="sum",
                                   backend=backend))
    summed.extend(rows(0, 2))
    with pytest.raises(ValueError, match="overflows"):
        summed.update_priority(torch.tensor([0]), torch.tensor([[1e308, 1e308]], dtype=f64))
    # priorities of data written with them (td_error in the rows)
    data = rows(100, 2)
    data["td_error"] = torch.tensor([1.0, 1e200], dtype=f64)
    with pytest.raises(ValueError, match="overflows"):
        rb.extend(data)
    assert_unchanged(rb, before)
    # shapes that do not pair with the index (flat order) and object arrays
    with pytest.raises(ValueError, match="does not match"):
        rb.update_priority(torch.arange(6).reshape(2, 3), torch.ones(3, 2))
    assert_unchanged(rb, before)
    tally.injected("overflowing or mismatched priority", len(bad) + 3)
    assert math.isfinite(rb.sampler.total_priority)
    rb.sample()
    roundtrip(rb, make, tmp_path / "ckpt")  # the trees hold no inf: the checkpoint loads


@pytest.mark.parametrize("kind", ["lazy", "memmap"])
def test_lossy_casts_are_refused(tmp_path, tally, kind):
    def make():
        return TensorDictReplayBuffer(storage=storage_of(kind, tmp_path, name="again"),
                                      batch_size=4, generator=torch.Generator().manual_seed(0))

    rb = TensorDictReplayBuffer(storage=storage_of(kind, tmp_path), batch_size=4,
                                generator=torch.Generator().manual_seed(0))
    rb.extend(rows(0, 6))
    before = fingerprint(rb)
    lossy = []
    for key, value in [("i", torch.full((5,), 0.7)),                         # float into int64
                       ("obs", torch.full((5, 3), 1e300, dtype=torch.float64)),  # inf in f32
                       ("done", torch.tensor([0, 1, 2, 0, 1]))]:             # 2 into bool
        data = rows(50)
        data[key] = value
        lossy.append(data)
    for data in lossy:
        with pytest.raises((TypeError, ValueError), match="entry"):
            rb.extend(data)
        assert_unchanged(rb, before)
    tally.injected("lossy cast", len(lossy))
    ok = rows(60)
    ok["i"] = ok["i"].to(torch.int32)                  # lossless casts still work
    ok["obs"] = ok["obs"].double()
    rb.extend(ok)
    assert rb.storage[:]["i"].tolist()[-5:] == list(range(60, 65))
    roundtrip(rb, make, tmp_path / "ckpt")


@pytest.mark.parametrize("kind", ["lazy", "memmap"])
def test_states_of_a_bigger_tensor_buffer_are_refused_and_leave_it_unlaid(tmp_path, tally, kind):
    big = TensorDictReplayBuffer(storage=storage_of(kind, tmp_path, 2 * CAPACITY, "big"),
                                 batch_size=4)
    big.extend(rows(0, CAPACITY + 8))
    small = TensorDictReplayBuffer(storage=storage_of(kind, tmp_path, CAPACITY, "small"),
                                   batch_size=4)
    state = big.state_dict()
    with pytest.raises(ValueError, match="max_size"):
        small.load_state_dict(state)
    assert not small.storage.initialized and len(small) == 0 and small.write_count == 0
    storage_state = dict(state["_storage"])
    del storage_state["max_size"]  # a state saved before max_size was recorded
    with pytest.raises(ValueError, match="rows"):
        small.storage.load_state_dict(storage_state)
    assert not small.storage.initialized
    big.dumps(tmp_path / "big-ckpt")
    with pytest.raises(CheckpointError, match="max_size"):
        small.loads(tmp_path / "big-ckpt")
    assert not small.storage.initialized and len(small) == 0
    tally.injected("refused state (tensor storage)", 3)
    # the storage lays out from whatever it is given next, and goes on
    small.extend(TensorDict({"x": torch.zeros(4, 7)}, [4]))
    assert small.sample()["x"].shape == (4, 7)


@pytest.mark.parametrize("kind", ["lazy", "memmap"])
def test_meta_tensors_do_not_lay_out_a_storage(tmp_path, tally, kind):
    rb = TensorDictReplayBuffer(storage=storage_of(kind, tmp_path), batch_size=2)
    with pytest.raises(ValueError, match="meta tensor"):
        rb.extend(TensorDict({"obs": torch.zeros(4, 3, device="meta")}, [4]))
    assert not rb.storage.initialized and len(rb) == 0
    tally.injected("meta-device data")
    rb.extend(rows(0))
    assert len(rb) == 5
