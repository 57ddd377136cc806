"""A SliceSamplerWithoutReplacement epoch keeps the ids of the trajectories it will visit; when
the trajectory index is rebuilt (a write the sampler was not told of, e.g. straight into the
storage), those ids name other trajectories. The epoch went on with them: trajectories were
skipped or visited twice in one epoch, and ids past the new table raised IndexError (and a
state saved then was refused on load). A rebuilt index now starts a new epoch."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.samplers import SliceSamplerWithoutReplacement
from tdreplay.storages import LazyTensorStorage


def buffer() -> TensorDictReplayBuffer:
    sampler = SliceSamplerWithoutReplacement(slice_len=2, traj_key="episode", shuffle=False)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(40), sampler=sampler)
    rb.extend(TensorDict({"episode": torch.arange(40) // 4, "obs": torch.arange(40)}, [40]))
    return rb


def merge_first_two_episodes(rb: TensorDictReplayBuffer) -> None:
    rows = rb.storage[4:8].clone()
    rows["episode"][:] = 0
    rb.storage[4:8] = rows  # not through the buffer: the sampler sees it at its next sync


def epoch(rb: TensorDictReplayBuffer) -> list[int]:
    visited = []
    while True:
        visited += rb.sample(4)["episode"][::2].tolist()
        if rb.sampler.ran_out:
            return visited


def test_a_rebuilt_index_starts_a_new_epoch_visiting_each_trajectory_once():
    rb = buffer()
    assert rb.sample(4)["episode"].tolist() == [0, 0, 1, 1]
    merge_first_two_episodes(rb)
    assert epoch(rb) == [0, 2, 3, 4, 5, 6, 7, 8, 9]  # the old epoch went on: 4, 5, ... 9, 0, ...


def test_state_saved_after_a_rebuild_loads_and_samples_as_the_saved_buffer():
    rb = buffer()
    rb.sample(4)
    merge_first_two_episodes(rb)
    rb.sample(4)  # the index is rebuilt here
    state = rb.state_dict()
    twin = buffer()
    twin.load_state_dict(state)
    assert epoch(twin) == epoch(rb) == [3, 4, 5, 6, 7, 8, 9]  # [0, 2] drawn at the rebuild


def test_a_stale_saved_epoch_is_not_checked_against_the_index():
    rb = buffer()
    rb.sample(4)
    merge_first_two_episodes(rb)
    state = rb.state_dict()
    state["_sampler"]["epoch"] = torch.tensor([10**6])  # void ids, never read: stale epoch
    state["_sampler"]["epoch_meta"][0], state["_sampler"]["epoch_meta"][3] = 0, 1
    twin = buffer()
    twin.load_state_dict(state)
    assert epoch(twin)[0] == 0


def test_a_state_whose_epoch_is_not_a_permutation_is_refused():
    rb = buffer()
    rb.sample(4)
    state = rb.state_dict()
    epoch_ids = state["_sampler"]["epoch"]
    twice = torch.cat([epoch_ids[:-1], epoch_ids[2:3]])  # one trajectory twice, one missing
    restored = buffer()
    before = restored.sampler.state_dict()
    with pytest.raises(ValueError, match="names a trajectory twice"):
        restored.load_state_dict({**state, "_sampler": {**state["_sampler"], "epoch": twice}})
    with pytest.raises(ValueError, match="leaves out 1 of the index's trajectories"):
        restored.load_state_dict({**state, "_sampler": {**state["_sampler"],
                                                        "epoch": epoch_ids[:-1].clone()}})
    assert torch.equal(restored.sampler.state_dict()["epoch"], before["epoch"])
    restored.load_state_dict(state)  # the saved epoch loads
    assert epoch(restored) == epoch(rb)


@pytest.mark.parametrize("refused", [
    lambda rb: rb.__setitem__(0, "junk"),
    lambda rb: rb.extend(TensorDict({"episode": torch.zeros(2, dtype=torch.long),
                                     "obs": torch.zeros(2, 3)}, [2])),
], ids=["assignment-of-junk", "extend-of-a-wrong-shape"])
def test_a_refused_write_keeps_the_epoch(refused):
    # a refused write advances the storage's revision (it cannot tell a refusal from a write
    # that failed half-way): the rebuilt index has the same trajectories, the epoch goes on
    rb, twin = buffer(), buffer()
    assert rb.sample(4)["episode"].tolist() == twin.sample(4)["episode"].tolist()
    revision = rb.storage.revision
    with pytest.raises((TypeError, ValueError, KeyError)):
        refused(rb)
    assert rb.storage.revision != revision
    assert epoch(rb) == epoch(twin) == [2, 3, 4, 5, 6, 7, 8, 9]

