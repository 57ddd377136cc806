"""Prioritized replay with CUDA trees and/or CUDA storage (the reference's three examples, scaled
down), and the no-host-sync guarantee of sample / update_priority. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.samplers import PrioritizedSampler, TensorDictPrioritizedReplayBuffer
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

SIZE, N, BATCH = 20_000, 5_000, 4_096


def data(device: str) -> TensorDict:
    return TensorDict({"obs": torch.randn(N, 8, device=device),
                       "td_error": torch.ones(N, device=device)}, [N], device=device)


def cycle(rb: TensorDictPrioritizedReplayBuffer, device: str) -> TensorDict:
    rb.extend(data(device))
    sample = rb.sample()
    assert sample.batch_size == torch.Size([BATCH])
    assert sample["priority_weight"].device.type == device
    sample["td_error"] = torch.rand(sample.shape, device=device)
    rb.update_tensordict_priority(sample)
    return sample


def test_all_cuda_storage_and_sampling():
    rb = TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5,
                                           storage=LazyTensorStorage(SIZE, device="cuda"),
                                           batch_size=BATCH, priority_key="td_error")
    assert (rb.sampler.backend, rb.sampler.device.type) == ("torch", "cuda")
    sample = cycle(rb, "cuda")
    state = rb.sampler.state_dict()
    idx = sample["index"].cpu()
    expected = (sample["td_error"].double().cpu() + rb.sampler.eps) ** 0.7
    # duplicates: the last write wins, so compare at the last occurrence of each slot
    last = {int(i): k for k, i in enumerate(idx.tolist())}
    keys = torch.tensor(list(last))
    torch.testing.assert_close(state["priorities"][keys], expected[list(last.values())])


def test_cpu_memmap_storage_with_cuda_sampling(tmp_path):
    rb = TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5,
                                           storage=LazyMemmapStorage(SIZE, scratch_dir=tmp_path),
                                           sampler_device="cuda", batch_size=BATCH,
                                           priority_key="td_error")
    assert (rb.sampler.backend, rb.sampler.device.type) == ("torch", "cuda")
    cycle(rb, "cpu")


def test_cuda_storage_with_cpu_sampling():
    rb = TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5,
                                           storage=LazyTensorStorage(SIZE, device="cuda"),
                                           sampler_device="cpu", batch_size=BATCH,
                                           priority_key="td_error")
    assert (rb.sampler.backend, rb.sampler.device.type) == ("numba", "cpu")
    cycle(rb, "cuda")


def test_core_buffer_moves_its_trees_to_the_cuda_storage():
    sampler = PrioritizedSampler(SIZE, alpha=0.7, beta=0.5)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(SIZE, device="cuda"), sampler=sampler)
    rb.extend(data("cuda"))  # the sampler has not seen the storage yet: CPU trees for now
    before = sampler.state_dict()["priorities"]
    rb.sample(16)  # now it has: the trees move to CUDA with their priorities
    assert (sampler.backend, sampler.device.type) == ("torch", "cuda")
    assert torch.equal(sampler.state_dict()["priorities"], before)


def test_cuda_trees_sample_like_numba_trees():
    out = []
    for backend, device in (("numba", "cpu"), ("torch", "cuda")):
        sampler = PrioritizedSampler(1000, alpha=0.7, beta=0.5, backend=backend, device=device)
        storage = LazyTensorStorage(1000)
        storage.set(torch.arange(1000), torch.zeros(1000))
        sampler.extend(torch.arange(1000))
        sampler.update_priority(torch.arange(1000), torch.linspace(0, 5, 1000))
        sampler.set_rng(torch.Generator().manual_seed(0))  # CPU draws, moved to the trees
        index, info = sampler.sample(storage, 777)
        out.append((index.cpu(), info["priority_weight"].cpu()))
    assert torch.equal(out[0][0], out[1][0])  # same float64 descent: the same slots
    torch.testing.assert_close(out[0][1], out[1][1])  # exp/log may differ in the last bit


def test_sample_and_update_priority_do_not_sync():
    sampler = PrioritizedSampler(SIZE, alpha=0.7, beta=0.5, device="cuda")
    storage = LazyTensorStorage(SIZE, device="cuda")
    storage.set(torch.arange(SIZE), torch.zeros(SIZE, device="cuda"))
    sampler.place_for(storage)
    sampler.extend(torch.arange(SIZE))
    sampler.set_rng(torch.Generator(device="cuda").manual_seed(0))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            index, info = sampler.sample(storage, BATCH)
            priority = torch.rand(BATCH, device="cuda")
            sampler.update_priority(index, priority, storage=storage,
                                    write_generation=info["write_generation"])
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_device_updates_drop_bad_input_without_raising():
    sampler = PrioritizedSampler(8, alpha=1.0, beta=1.0, eps=0.0, device="cuda")
    sampler.extend(torch.arange(6))
    before = sampler.state_dict()["priorities"]
    sampler.update_priority(torch.tensor([0, 1], device="cuda"),
                            torch.tensor([2.0, float("nan")], device="cuda"))
    assert torch.equal(sampler.state_dict()["priorities"], before)  # the whole update dropped
    sampler.update_priority(torch.tensor([0, 7, 9, -3], device="cuda"),
                            torch.full((4,), 3.0, device="cuda"))
    after = sampler.state_dict()["priorities"]
    assert after[0] == 3.0 and after[6:].tolist() == [0.0, 0.0]  # unwritten / out of range


def test_device_stale_updates_are_skipped():
    sampler = PrioritizedSampler(4, alpha=1.0, beta=1.0, eps=0.0, device="cuda")
    storage = LazyTensorStorage(4, device="cuda")
    storage.set(torch.arange(4), torch.zeros(4, device="cuda"))
    sampler.extend(torch.arange(4))
    index, info = sampler.sample(storage, 64)
    sampler.extend(torch.tensor([0, 1]))
    sampler.update_priority(index, torch.full((64,), 0.5, device="cuda"),
                            write_generation=info["write_generation"], storage=storage)
    prio = sampler.state_dict()["priorities"]
    assert prio[:2].tolist() == [1.0, 1.0]
    for slot in set(index.tolist()) - {0, 1}:
        assert prio[slot] == 0.5
