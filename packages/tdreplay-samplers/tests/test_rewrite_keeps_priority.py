"""``rb[i] = x`` keeps the slot's priority (as TorchRL's), ``rb.mark_update`` gives the default
one; the write generation of a rewritten slot moves on (stale updates stay skipped)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ReplayBuffer, TensorDictReplayBuffer
from tdreplay.samplers import (
    DeferredPrioritizedSampler,
    PrioritizedReplayBuffer,
    PrioritizedSampler,
    PrioritizedSliceSampler,
    TensorDictPrioritizedReplayBuffer,
)
from tdreplay.storages import LazyTensorStorage


def weights(rb, n: int = 64) -> dict[int, float]:
    rb.set_rng(torch.Generator().manual_seed(0))
    _, info = rb.sample(n, return_info=True)
    return {int(i): round(float(w), 4) for i, w in zip(info["index"], info["priority_weight"])}


def test_plain_buffer_rewrite_keeps_priority() -> None:
    rb = PrioritizedReplayBuffer(alpha=1.0, beta=1.0, storage=LazyTensorStorage(2))
    rb.extend(torch.tensor([0.0, 1.0]))
    rb.update_priority(torch.tensor([0, 1]), torch.tensor([1.0, 4.0]))
    assert weights(rb) == {0: 1.0, 1: 0.25}
    rb[0] = torch.tensor(5.0)
    assert weights(rb) == {0: 1.0, 1: 0.25}  # TorchRL's values; slot 0 is not reset to 4.0
    assert rb.sampler.state_dict()["priorities"][:2].tolist() == pytest.approx([1.0, 4.0])
    assert rb[0].item() == 5.0


def test_tensordict_buffer_rewrite_keeps_priority() -> None:
    rb = TensorDictPrioritizedReplayBuffer(alpha=1.0, beta=1.0, storage=LazyTensorStorage(2),
                                           priority_key="td_error")
    rb.extend(TensorDict({"x": torch.tensor([0.0, 1.0]),
                          "td_error": torch.tensor([1.0, 4.0])}, [2]))
    rb[0] = TensorDict({"x": torch.tensor(5.0), "td_error": torch.tensor(1.0)}, [])
    sample = rb.sample(64)
    got = {int(i): round(float(w), 4) for i, w in zip(sample["index"], sample["priority_weight"])}
    assert got == {0: 1.0, 1: 0.25}


def test_explicit_mark_update_gives_the_default_priority() -> None:
    rb = PrioritizedReplayBuffer(alpha=1.0, beta=1.0, storage=LazyTensorStorage(2))
    rb.extend(torch.tensor([0.0, 1.0]))
    rb.update_priority(torch.tensor([0, 1]), torch.tensor([1.0, 4.0]))
    rb.mark_update(0)  # TorchRL's PrioritizedSampler.mark_update: the default priority
    assert rb.sampler.state_dict()["priorities"][:2].tolist() == pytest.approx([4.0, 4.0])
    assert weights(rb) == {0: 1.0, 1: 1.0}


def test_rewrite_moves_the_write_generation_on() -> None:
    rb = PrioritizedReplayBuffer(alpha=1.0, beta=1.0, storage=LazyTensorStorage(2))
    rb.extend(torch.tensor([0.0, 1.0]))
    rb.update_priority(torch.tensor([0, 1]), torch.tensor([1.0, 4.0]))
    gen = rb.sampler.slot_generation(torch.tensor([0, 1]))
    rb[0] = torch.tensor(5.0)
    after = rb.sampler.slot_generation(torch.tensor([0, 1]))
    assert int(after[0]) > int(gen[0]) and int(after[1]) == int(gen[1])
    # an update computed for the replaced item is skipped; the other one is applied
    rb.update_priority(torch.tensor([0, 1]), torch.tensor([9.0, 2.0]), write_generation=gen)
    assert rb.sampler.state_dict()["priorities"][:2].tolist() == pytest.approx([1.0, 2.0])


def test_rewrite_of_a_slot_without_priority_gives_the_max_priority() -> None:
    sampler = PrioritizedSampler(4, alpha=1.0, beta=1.0, eps=0.0)
    sampler.extend(torch.tensor([0]))
    sampler.update_priority(torch.tensor([0]), torch.tensor([3.0]))
    sampler.mark_rewritten(torch.tensor([0, 1]))
    state = sampler.state_dict()
    assert state["priorities"].tolist() == [3.0, 3.0, 0.0, 0.0]
    assert (state["write_generation"][:2] > 0).all() and (state["write_generation"][2:] == 0).all()
    sampler.load_state_dict(state)  # a consistent state


def test_torch_trees_rewrite_keeps_priority() -> None:
    sampler = PrioritizedSampler(4, alpha=1.0, beta=1.0, eps=0.0, backend="torch")
    rb = ReplayBuffer(storage=LazyTensorStorage(4), sampler=sampler)
    rb.extend(torch.arange(3.0))
    rb.update_priority(torch.arange(3), torch.tensor([1.0, 2.0, 8.0]))
    rb[1] = torch.tensor(7.0)
    assert sampler.state_dict()["priorities"][:3].tolist() == [1.0, 2.0, 8.0]
    rb.set_rng(torch.Generator().manual_seed(0))
    _, info = rb.sample(64, return_info=True)
    got = {int(i): round(float(w), 4) for i, w in zip(info["index"], info["priority_weight"])}
    assert got == {0: 1.0, 1: 0.5, 2: 0.125}


def test_prioritized_slice_sampler_rewrite_keeps_priority_and_finds_trajectories() -> None:
    sampler = PrioritizedSliceSampler(8, alpha=1.0, beta=1.0, eps=0.0, slice_len=2,
                                      traj_key="episode")
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8), sampler=sampler)
    rb.extend(TensorDict({"episode": torch.tensor([0, 0, 0, 1, 1, 1])}, [6]))
    priority = torch.tensor([1.0, 1.0, 1.0, 5.0, 1.0, 1.0])
    rb.update_priority(torch.arange(6), priority)
    rb[2] = TensorDict({"episode": torch.tensor(1)}, [])  # step 2 joins episode 1
    assert sampler.priorities.state_dict()["priorities"][:6].tolist() == priority.tolist()
    rb.set_rng(torch.Generator().manual_seed(0))
    index = rb.sample(200)["index"].view(-1, 2)
    # the trajectories were found again: [0, 1] and [2, 3, 4, 5] (slices never cross them)
    assert {tuple(r) for r in index.tolist()} <= {(0, 1), (2, 3), (3, 4), (4, 5)}
    assert (index[:, 0] == 3).sum() > (index[:, 0] == 0).sum()  # priority 5 kept at step 3
    rb.mark_update(torch.tensor([0]))  # the max priority
    assert sampler.priorities.state_dict()["priorities"][0].item() == 5.0


def test_deferred_sampler_in_the_learner_keeps_priority() -> None:
    rb = TensorDictPrioritizedReplayBuffer(alpha=1.0, beta=1.0, storage=LazyTensorStorage(2),
                                           sync=False)
    assert isinstance(rb.sampler, DeferredPrioritizedSampler)
    rb.extend(TensorDict({"x": torch.tensor([0.0, 1.0])}, [2]))
    rb.sample(2)  # the learner catches up
    rb.update_priority(torch.tensor([0, 1]), torch.tensor([1.0, 4.0]))
    rb[0] = TensorDict({"x": torch.tensor(5.0)}, [])
    state = rb.sampler.prioritized.state_dict()
    assert state["priorities"][:2].tolist() == pytest.approx([1.0, 4.0])


def test_second_buffer_of_the_storage_keeps_priority() -> None:
    storage = LazyTensorStorage(2)
    writer = ReplayBuffer(storage=storage)
    reader = ReplayBuffer(storage=storage, sampler=PrioritizedSampler(2, alpha=1.0, beta=1.0,
                                                                      eps=0.0))
    writer.extend(torch.tensor([0.0, 1.0]))
    reader.update_priority(torch.tensor([0, 1]), torch.tensor([1.0, 4.0]))
    gen = reader.sampler.slot_generation(torch.tensor([0]))
    writer[0] = torch.tensor(5.0)
    assert reader.sampler.state_dict()["priorities"].tolist() == [1.0, 4.0]
    assert int(reader.sampler.slot_generation(torch.tensor([0]))) > int(gen)
