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


def graph_recordings(monkeypatch) -> list[bool]:
    """Whether each recording of a draw or a priority update in a CUDA graph succeeded, starting
    from no graph (those of earlier tests may have keys of this test's tensors' addresses)."""
    from tdreplay.samplers import _priority_graphs, _priority_kernels

    monkeypatch.setattr(_priority_kernels, "_GRAPHS", _priority_graphs.StateGraphs())
    calls: list[bool] = []
    record = _priority_graphs.StateGraphs._record

    def counting(self, *args, **kwargs):
        recorded = record(self, *args, **kwargs)
        calls.append(recorded is not None)
        return recorded

    monkeypatch.setattr(_priority_graphs.StateGraphs, "_record", counting)
    return calls


def run_cycles(graphs: str, monkeypatch, capacity: int = 2000, rounds: int = 5,
               within_buffer: bool = False) -> tuple[dict, list[torch.Tensor]]:
    """Cycles of sample (``beta`` annealed: a new value each time), a write of some sampled
    slots, and the update of the sample's priorities (stale ones skipped), with
    ``TDREPLAY_CUDA_GRAPHS=graphs``: the sampler's state, and the slots drawn and their
    weights."""
    monkeypatch.setenv("TDREPLAY_CUDA_GRAPHS", graphs)
    sampler = PrioritizedSampler(capacity, alpha=0.7, beta=0.5, device="cuda",
                                 max_priority_within_buffer=within_buffer)
    storage = LazyTensorStorage(capacity, device="cuda")
    storage.set(torch.arange(capacity), torch.zeros(capacity, device="cuda"))
    sampler.extend(torch.arange(capacity))
    sampler.set_rng(torch.Generator(device="cuda").manual_seed(3))
    g = torch.Generator(device="cuda").manual_seed(4)
    drawn = []
    for step in range(rounds):
        sampler.beta = 0.4 + 0.1 * step
        index, info = sampler.sample(storage, 512)
        sampler.extend(index[:7])  # their tokens go stale: the update skips them
        priority = torch.rand(512, device="cuda", generator=g) * 3
        sampler.update_priority(index, priority, storage=storage,
                                write_generation=info["write_generation"])
        drawn.extend([index.cpu(), info["priority_weight"].cpu()])
    return sampler.state_dict(), drawn


@pytest.mark.parametrize("within_buffer", [False, True])
def test_graph_replayed_draws_and_updates_equal_eager_ones(monkeypatch, within_buffer):
    recordings = graph_recordings(monkeypatch)
    eager_state, eager_draws = run_cycles("0", monkeypatch, within_buffer=within_buffer)
    assert recordings == []
    state, draws = run_cycles("1", monkeypatch, within_buffer=within_buffer)
    # the second round's draw and update recorded, the next three rounds' replayed (beta is
    # an input of the draw's graph, not a constant)
    assert recordings == [True, True]
    for a, b in zip(draws, eager_draws, strict=True):  # slots and weights, bit for bit
        assert torch.equal(a, b)
    assert (state["set_priorities"] is None) is not within_buffer  # kept with a max tree only
    for key in ("priorities", "set_priorities", "write_generation"):
        if state[key] is not None:
            assert torch.equal(state[key], eager_state[key]), key
    assert state["max_priority"] == eager_state["max_priority"]


def test_a_replaced_state_is_updated_not_the_recorded_one(monkeypatch):
    """After ``load_state_dict``, updates land in the loaded state, whether it has tensors of its
    own (then a graph of its own) or was copied into the recorded ones."""
    recordings = graph_recordings(monkeypatch)
    sampler = PrioritizedSampler(100, alpha=1.0, beta=1.0, eps=0.0, device="cuda")
    sampler.extend(torch.arange(100))
    index = torch.arange(10, device="cuda")
    for value in (2.0, 3.0):
        sampler.update_priority(index, torch.full((10,), value, device="cuda"))
    assert recordings == [True]
    fresh = PrioritizedSampler(100, alpha=1.0, beta=1.0, eps=0.0, device="cuda")
    fresh.extend(torch.arange(100))
    saved = fresh.state_dict()
    sampler.load_state_dict(saved)
    for value in (4.0, 5.0):
        sampler.update_priority(index, torch.full((10,), value, device="cuda"))
        fresh.update_priority(index, torch.full((10,), value, device="cuda"))
    assert torch.equal(sampler.state_dict()["priorities"], fresh.state_dict()["priorities"])
    assert sampler.state_dict()["priorities"][:10].tolist() == [5.0] * 10
    assert sampler.total_priority == 140.0


def test_updates_inside_a_callers_graph_capture_are_not_recorded_again(monkeypatch):
    recordings = graph_recordings(monkeypatch)
    sampler = PrioritizedSampler(100, alpha=1.0, beta=1.0, eps=0.0, device="cuda")
    sampler.extend(torch.arange(100))
    index = torch.arange(10, device="cuda")
    priority = torch.full((10,), 2.0, device="cuda")
    sampler.update_priority(index, priority)  # eager: compiles the kernels, the key is seen
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sampler.update_priority(index, priority)
    assert recordings == []  # recorded into the caller's graph, not one of its own
    priority.fill_(6.0)
    graph.replay()
    torch.cuda.synchronize()
    assert sampler.state_dict()["priorities"][:10].tolist() == [6.0] * 10
