"""A storage restored alone (its own ``state_dict`` or ``dumps``) keeps where its ring is cut:
slices, queries and the index of a buffer built on it never join the newest step to the
oldest (``last_written_row`` was lost, and a slice ``(12, 3)`` came out of a ring whose newest
step is 12 and oldest 3)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ListStorage, TensorDictReplayBuffer
from tdreplay.samplers import PrioritizedSliceSampler, SliceSampler, SliceSamplerWithoutReplacement
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage

STORAGES = {"lazy_tensor": LazyTensorStorage, "lazy_memmap": LazyMemmapStorage}


def wrapped_storage(make):
    rb = TensorDictReplayBuffer(storage=make(10))
    rb.extend(TensorDict({"episode": torch.zeros(13, dtype=torch.long),
                          "step": torch.arange(13)}, [13]))  # rows 0..2 hold steps 10..12
    return rb.storage


def restored(storage, make, how, tmp_path):
    fresh = make(10)
    if how == "state_dict":
        fresh.load_state_dict(storage.state_dict())
    else:
        storage.dumps(tmp_path / "storage")
        fresh.loads(tmp_path / "storage")
    return fresh


@pytest.mark.parametrize("kind", list(STORAGES))
@pytest.mark.parametrize("how", ["state_dict", "dumps"])
def test_a_restored_storage_keeps_its_seam(kind, how, tmp_path):
    make = STORAGES[kind]
    storage = restored(wrapped_storage(make), make, how, tmp_path)
    assert storage.last_written_row == 2
    rb = TensorDictReplayBuffer(storage=storage, sampler=SliceSampler(slice_len=2,
                                                                      traj_key="episode"))
    pairs = {tuple(p) for p in rb.sample(400)["step"].reshape(-1, 2).tolist()}
    assert pairs == {(s, s + 1) for s in range(3, 12)}  # never (12, 3)
    (trajectory,) = rb.query()
    assert trajectory.data["step"].tolist() == list(range(3, 13))


def test_a_list_storage_state_keeps_its_seam():
    storage = ListStorage(3)
    storage.set(torch.arange(3), ["a", "b", "c"])
    storage.set(0, "d")
    restored_storage = ListStorage(3)
    restored_storage.load_state_dict(storage.state_dict())
    assert restored_storage.last_written_row == 0


def test_a_bad_saved_seam_is_refused_before_anything_loads():
    storage = wrapped_storage(LazyTensorStorage)
    state = storage.state_dict()
    state["last_written_row"] = 10
    fresh = LazyTensorStorage(10)
    with pytest.raises(ValueError, match=r"state_dict\['last_written_row'\] must be None or a row"):
        fresh.load_state_dict(state)
    assert len(fresh) == 0


def env_time_storage(make):
    """A time-major ring of 4 rows x 2 environments written with 6 steps of each: rows 0, 1
    hold steps 4, 5 (``last_written_row`` 1), rows 2, 3 steps 2, 3."""
    storage = make(8, ndim=2)
    rb = TensorDictReplayBuffer(storage=storage)
    rb.extend(TensorDict({"episode": torch.zeros(2, 6, dtype=torch.long),
                          "step": torch.arange(6).expand(2, 6).clone()}, [2, 6]))
    return storage


@pytest.mark.parametrize("kind", list(STORAGES))
@pytest.mark.parametrize("how", ["new_buffer", "set_sampler", "bump_revision", "state_dict"])
@pytest.mark.parametrize("sampler", ["slice", "without_replacement", "prioritized"])
def test_a_multi_dim_ring_is_cut_after_its_newest_row(kind, how, sampler, tmp_path):
    """The row ``last_written_row`` of a time-major storage was taken for a flat slot: a
    sampler rebuilding its index (another buffer, ``set_sampler``, ``bump_revision``, a
    restored storage) joined step 5 to step 2 and never drew (3, 4)."""
    make = STORAGES[kind]
    samplers = {"slice": lambda: SliceSampler(slice_len=2, traj_key="episode"),
                "without_replacement": lambda: SliceSamplerWithoutReplacement(
                    slice_len=2, traj_key="episode"),
                "prioritized": lambda: PrioritizedSliceSampler(
                    8, alpha=0.7, beta=0.5, slice_len=2, traj_key="episode")}
    storage = env_time_storage(make)
    if how == "state_dict":
        restored_storage = make(8, ndim=2)
        restored_storage.load_state_dict(storage.state_dict())
        storage = restored_storage
    assert storage.last_written_row == 1
    rb = TensorDictReplayBuffer(storage=storage, sampler=samplers[sampler]())
    if how == "set_sampler":
        rb.sample(2)
        rb.set_sampler(samplers[sampler]())
    elif how == "bump_revision":
        rb.sample(2)
        storage.bump_revision()
    pairs = {tuple(p) for _ in range(60) for p in rb.sample(4)["step"].reshape(-1, 2).tolist()}
    assert pairs == {(2, 3), (3, 4), (4, 5)}  # never (5, 2)


def episodes_of(length: int) -> TensorDictReplayBuffer:
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(20), sampler=SliceSampler(
        slice_len=3, traj_key="episode"))
    rb.extend(TensorDict({"x": torch.arange(12), "episode": torch.arange(12) // length}, [12]))
    rb.sample(3)
    return rb


@pytest.mark.parametrize("how", ["sampler", "buffer"])
def test_a_sampler_state_saved_with_other_data_is_recomputed_from_the_storage(how):
    """A slice sampler state of episodes of 6 loaded over episodes of 3 was taken as it was:
    slices (1, 2, 3) and (7, 8, 9) crossed episodes."""
    saved, rb = episodes_of(6), episodes_of(3)
    if how == "sampler":
        rb.sampler.load_state_dict(saved.sampler.state_dict())
    else:
        state = rb.state_dict()
        state["_sampler"] = saved.sampler.state_dict()
        rb.load_state_dict(state)
    with pytest.warns(RuntimeWarning, match="saved trajectories are not those of the storage"):
        rb.sample(3)
    for _ in range(50):
        episode = rb.sample(3)["episode"]
        assert (episode == episode[0]).all()


def test_a_sampler_state_saved_with_its_data_loads_without_a_warning(recwarn):
    rb = episodes_of(3)
    rb.sampler.load_state_dict(rb.sampler.state_dict())
    rb.sample(3)
    assert not [w for w in recwarn if "saved trajectories" in str(w.message)]
