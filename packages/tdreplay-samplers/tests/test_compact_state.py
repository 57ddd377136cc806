"""The compact per-slot state of the samplers (issue 19): int32 write generations that wrap
around, a trajectory index whose record table grows with the trajectories (not with the size of
a write), int32 slot records of the prioritized slice sampler; and what stays the same: the
checkpoint formats (int64 tensors) and what a restored sampler samples."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ListStorage, TensorDictReplayBuffer
from tdreplay.samplers import PrioritizedSampler, PrioritizedSliceSampler, SliceSampler
from tdreplay.samplers._priority_state import GENERATION_PERIOD
from tdreplay.samplers.segment_trees._memory import HUGE_PAGE, host_array
from tdreplay.storages import LazyTensorStorage

BACKENDS = ["numba", "torch"]


def sampler_over(backend: str, n: int) -> tuple[PrioritizedSampler, ListStorage]:
    storage = ListStorage(n)
    storage.set(torch.arange(n), list(range(n)))
    sampler = PrioritizedSampler(n, alpha=1.0, beta=1.0, backend=backend)
    sampler.extend(torch.arange(n))
    return sampler, storage


# ---- write generations ---------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_generations_are_stored_as_int32_and_returned_as_int64(backend):
    sampler, storage = sampler_over(backend, 4)
    assert sampler._state.generation.dtype == torch.int32
    index, info = sampler.sample(storage, 8)
    assert info["write_generation"].dtype == torch.int64
    assert info["write_generation"].tolist() == [1] * 8
    assert sampler.slot_generation(torch.arange(4)).dtype == torch.int64
    state = sampler.state_dict()
    assert state["write_generation"].dtype == torch.int64  # the checkpoint format is unchanged


@pytest.mark.parametrize("backend", BACKENDS)
def test_generations_wrap_around_and_stale_updates_are_still_skipped(backend):
    sampler, storage = sampler_over(backend, 4)
    sampler._clock = GENERATION_PERIOD - 1
    sampler.extend(torch.tensor([0]))  # clock GENERATION_PERIOD
    sampler.extend(torch.tensor([1]))  # clock GENERATION_PERIOD + 1: wraps to 1
    sampler.extend(torch.tensor([2]))  # wraps to 2
    assert sampler.slot_generation(torch.arange(4)).tolist() == [GENERATION_PERIOD, 1, 2, 1]
    token = sampler.slot_generation(torch.tensor([0, 2]))
    sampler.extend(torch.tensor([2]))  # slot 2 rewritten after the "sample": its update is stale
    sampler.update_priority(torch.tensor([0, 2]), torch.tensor([5.0, 7.0]),
                            write_generation=token)
    leaves = sampler.state_dict()["priorities"]
    assert leaves[0].item() == pytest.approx(5.0 + sampler.eps)
    assert leaves[2].item() == pytest.approx(1.0 + sampler.eps)  # the max at its write, not 7
    state = sampler.state_dict()
    assert state["write_clock"] == GENERATION_PERIOD + 3  # the clock itself does not wrap
    restored = PrioritizedSampler(4, alpha=1.0, beta=1.0, backend=backend)
    restored.load_state_dict(state)
    assert torch.equal(restored.slot_generation(torch.arange(4)),
                       sampler.slot_generation(torch.arange(4)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_int64_generations_of_an_older_checkpoint_load_wrapped(backend):
    saved, storage = sampler_over(backend, 3)
    state = saved.state_dict()
    state["write_generation"] = torch.tensor([1, 2**40, GENERATION_PERIOD])
    state["write_clock"] = 2**40
    sampler = PrioritizedSampler(3, alpha=1.0, beta=1.0, backend=backend)  # (no token out)
    sampler.load_state_dict(state)
    assert sampler.slot_generation(torch.arange(3)).tolist() == [1, 512, GENERATION_PERIOD]
    # an update carrying the wrapped generation it sampled is applied
    token = sampler.sample(storage, 16)[1]["write_generation"]
    index = sampler.sample(storage, 16)[0]
    assert set(token.tolist()) <= {1, 512, GENERATION_PERIOD}
    sampler.update_priority(torch.tensor([1]), torch.tensor([3.0]),
                            write_generation=torch.tensor([512]))
    assert sampler.state_dict()["priorities"][1].item() == pytest.approx(3.0 + sampler.eps)
    assert index.dtype == torch.int64


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_weights_of_any_dtype_agree_between_backends(dtype):
    out = {}
    for backend in BACKENDS:
        storage = ListStorage(50)
        storage.set(torch.arange(50), list(range(50)))
        sampler = PrioritizedSampler(50, alpha=0.6, beta=0.4, backend=backend, dtype=dtype)
        sampler.extend(torch.arange(50))
        sampler.update_priority(torch.arange(50), torch.linspace(0.0, 9.0, 50))
        sampler.set_rng(torch.Generator().manual_seed(5))
        out[backend] = sampler.sample(storage, 300)
    (i_a, info_a), (i_b, info_b) = out["numba"], out["torch"]
    assert torch.equal(i_a, i_b)
    assert info_a["priority_weight"].dtype == info_b["priority_weight"].dtype == dtype
    torch.testing.assert_close(info_a["priority_weight"], info_b["priority_weight"])


# ---- trajectory index ------------------------------------------------------------------------
def slice_buffer(sampler: SliceSampler, capacity: int) -> TensorDictReplayBuffer:
    return TensorDictReplayBuffer(storage=LazyTensorStorage(capacity), sampler=sampler,
                                  batch_size=32)


def test_record_table_grows_with_trajectories_not_with_the_write():
    sampler = SliceSampler(num_slices=4, traj_key="episode")
    rb = slice_buffer(sampler, 200_000)
    rb.extend(TensorDict({"episode": torch.arange(200_000) // 50_000}, [200_000]))
    rb.sample()
    index = sampler._index
    assert index.num_trajectories == 4
    assert index.rec.shape[0] <= 1024  # one row per step of the write before (200,000)


@pytest.mark.parametrize("track", [False, True])
def test_many_trajectories_in_one_write_overflow_the_table_and_are_all_kept(track):
    n, length = 30_000, 3
    sampler = (PrioritizedSliceSampler(max_capacity=n, alpha=0.7, beta=0.5, slice_len=length,
                                       traj_key="episode") if track
               else SliceSampler(slice_len=length, traj_key="episode"))
    rb = slice_buffer(sampler, n)
    rb.extend(TensorDict({"episode": torch.arange(n) // length, "step": torch.arange(n)}, [n]))
    batch = rb.sample(300).reshape(-1, length)
    assert bool((batch["episode"] == batch["episode"][:, :1]).all())
    assert bool((batch["step"] % length == torch.arange(length)).all())  # whole trajectories
    index = sampler._index
    assert index.num_trajectories == n // length
    assert index.rec.shape[0] <= 1.5 * (n // length) + 1024
    if track:
        assert str(index.slot_rec.dtype) == "int32"
    # a rebuild from the storage (index assignment) goes through the same growing table
    rb[torch.tensor([0])] = TensorDict({"episode": torch.tensor([0]),
                                        "step": torch.tensor([0])}, [1])
    rb.sample(300)
    assert sampler._index.num_trajectories == n // length


def test_prioritized_slice_checkpoint_keeps_int64_slot_records():
    def build() -> tuple[TensorDictReplayBuffer, PrioritizedSliceSampler]:
        sampler = PrioritizedSliceSampler(max_capacity=100, alpha=0.7, beta=0.5, slice_len=5,
                                          traj_key="episode")
        return slice_buffer(sampler, 100), sampler

    rb, sampler = build()
    rb.extend(TensorDict({"episode": torch.arange(100) // 20}, [100]))
    rb.sample(10)
    state = sampler.state_dict()
    slot_rec = state["index"]["slot_rec"]
    assert slot_rec.dtype == torch.int64 and slot_rec.shape == (100,)
    other, restored = build()
    other.extend(TensorDict({"episode": torch.arange(100) // 20}, [100]))
    restored.load_state_dict(state)
    assert str(restored._index.slot_rec.dtype) == "int32"
    assert torch.equal(torch.from_numpy(restored._index.slot_rec).long(), slot_rec)


# ---- host memory -----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype, fill", [(np.float64, 0.0), (np.float64, np.inf), (np.int32, 0)])
def test_large_host_arrays_are_aligned_private_and_filled(dtype, fill):
    arr = host_array(HUGE_PAGE // 4 + 3, dtype, fill)  # spans huge pages, with a partial tail
    assert arr.ctypes.data % HUGE_PAGE == 0 and arr.dtype == dtype
    assert arr.shape == (HUGE_PAGE // 4 + 3,) and bool((arr == fill).all())
    arr[-1] = 7
    copy = pickle.loads(pickle.dumps(arr))
    assert copy[-1] == 7 and bool((copy[:-1] == fill).all())


def test_pickled_sampler_on_huge_page_trees_samples_the_same():
    n = 300_000  # trees of 2.7 MiB and generations of 1.2 MiB: huge-page and plain arrays
    storage = ListStorage(n)
    storage.set(torch.arange(n), [0] * n)
    sampler = PrioritizedSampler(n, alpha=0.7, beta=0.5)
    sampler.extend(torch.arange(n))
    sampler.update_priority(torch.arange(n),
                            torch.rand(n, generator=torch.Generator().manual_seed(1)))
    assert sampler._state.sum_tree.nodes.ctypes.data % HUGE_PAGE == 0
    copy = pickle.loads(pickle.dumps(sampler))
    sampler.set_rng(torch.Generator().manual_seed(2))
    copy.set_rng(torch.Generator().manual_seed(2))
    (i_a, info_a), (i_b, info_b) = sampler.sample(storage, 64), copy.sample(storage, 64)
    assert torch.equal(i_a, i_b)
    assert torch.equal(info_a["priority_weight"], info_b["priority_weight"])
