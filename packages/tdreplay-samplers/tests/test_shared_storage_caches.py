"""Samplers of two buffers sharing one storage: a write through one buffer that keeps the
storage's length reaches the other's cached group / trajectory index (``Storage.revision``)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ReplayBuffer, Storage
from tdreplay.samplers import PromptGroupSampler, SliceSampler
from tdreplay.storages import LazyMemmapStorage, LazyStackStorage, LazyTensorStorage


def _storage(kind: str, size: int) -> Storage:
    if kind == "tensor":
        return LazyTensorStorage(size)
    if kind == "memmap":
        return LazyMemmapStorage(size)
    return LazyStackStorage(size)


def _pair(storage: Storage, make_sampler, batch_size: int) -> tuple[ReplayBuffer, ReplayBuffer]:
    reader = ReplayBuffer(storage=storage, sampler=make_sampler(), batch_size=batch_size)
    writer = ReplayBuffer(storage=storage, sampler=make_sampler(), batch_size=batch_size)
    reader.set_rng(torch.Generator().manual_seed(0))
    return reader, writer


@pytest.mark.parametrize("kind", ["tensor", "memmap", "stack"])
def test_prompt_groups_see_a_same_length_overwrite_by_another_buffer(kind: str) -> None:
    storage = _storage(kind, 6)
    reader, writer = _pair(storage, lambda: PromptGroupSampler(num_groups=2, group_key="prompt"),
                           batch_size=4)
    writer.extend(TensorDict({"prompt": torch.tensor([0, 0, 0, 1, 1, 1]),
                              "id": torch.arange(6)}, [6]))
    first = reader.sample()
    assert sorted(first["prompt"].tolist()) == [0, 0, 1, 1]
    # the writer's cursor is back at slot 0: rows 0-2 change group, the length stays 6
    writer.extend(TensorDict({"prompt": torch.tensor([1, 2, 2]),
                              "id": torch.tensor([10, 11, 12])}, [3]))
    assert len(storage) == 6
    for _ in range(8):
        batch = reader.sample()
        prompts, ids = batch["prompt"].tolist(), batch["id"].tolist()
        assert sorted(prompts) == [1, 1, 2, 2]  # group 0 is gone, whole groups of two
        assert sorted(i for p, i in zip(prompts, ids) if p == 2) == [11, 12]
        assert {i for p, i in zip(prompts, ids) if p == 1} <= {10, 3, 4, 5}


def test_prompt_groups_see_an_index_assignment_by_another_buffer() -> None:
    storage = LazyTensorStorage(4)
    reader, writer = _pair(storage, lambda: PromptGroupSampler(samples_per_group=2,
                                                               group_key="prompt"), 4)
    writer.extend(TensorDict({"prompt": torch.tensor([0, 0, 1, 1]), "id": torch.arange(4)}, [4]))
    reader.sample()
    writer[1] = TensorDict({"prompt": torch.tensor(1), "id": torch.tensor(7)}, [])
    with pytest.warns(UserWarning, match="smaller than the requested"):
        batch = reader.sample()  # two groups of two: group 0 keeps one member only
    groups = {int(p): sorted(batch["id"][batch["prompt"] == p].tolist())
              for p in batch["prompt"].unique()}
    # group 1 has three members now ([2, 3, 7]); group 0 only slot 0 (completed with itself)
    assert set(groups) == {0, 1}
    assert groups[0] == [0, 0]
    assert set(groups[1]) <= {2, 3, 7} and len(groups[1]) == 2


@pytest.mark.parametrize("kind", ["tensor", "memmap"])
def test_slice_sampler_sees_a_same_length_overwrite_by_another_buffer(kind: str) -> None:
    storage = _storage(kind, 8)
    reader, writer = _pair(storage, lambda: SliceSampler(slice_len=4, traj_key="episode"),
                           batch_size=8)
    writer.extend(TensorDict({"episode": torch.tensor([0, 0, 0, 0, 1, 1, 1, 1]),
                              "obs": torch.arange(8)}, [8]))
    first = reader.sample()
    assert sorted(first["obs"].tolist()) == list(range(8))  # two whole trajectories
    # a full-ring overwrite (same length): only slots 2-5 hold a trajectory of 4 steps now
    writer.extend(TensorDict({"episode": torch.tensor([5, 5, 6, 6, 6, 6, 7, 7]),
                              "obs": torch.arange(100, 108)}, [8]))
    assert len(storage) == 8
    for _ in range(5):
        batch = reader.sample()
        assert batch["episode"].tolist() == [6] * 8
        assert batch["obs"].tolist() == [102, 103, 104, 105] * 2
