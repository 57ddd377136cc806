"""Two buffers over one tensor storage, as TorchRL allows (``Storage.attach``): the writes of one
reach the other's prioritized and slice samplers, and the two never read a half-written row."""

from __future__ import annotations

import threading

import pytest
import torch
from tensordict import TensorDict

from tdreplay.data import (
    LazyTensorStorage,
    PrioritizedSampler,
    RandomSampler,
    ReplayBuffer,
    RoundRobinWriter,
    SliceSampler,
    TensorDictReplayBuffer,
)


def test_a_slot_rewritten_through_one_buffer_loses_its_old_priority_in_the_other() -> None:
    storage = LazyTensorStorage(4)
    writer = ReplayBuffer(storage=storage)
    prioritized = ReplayBuffer(storage=storage, sampler=PrioritizedSampler(4, alpha=1.0, beta=0.4))
    writer.extend(torch.arange(4.0))
    assert prioritized.sampler.total_priority > 0  # it heard of the 4 rows
    prioritized.update_priority(torch.tensor([0, 1, 2, 3]), torch.tensor([1e-6, 1e-6, 1e-6, 1.0]))
    assert bool((prioritized.sample(64) == 3.0).all())
    writer.extend(torch.tensor([40.0, 41.0, 42.0, 43.0]))  # every slot rewritten
    # each new row has the max priority (1.0): none keeps its predecessor's near-zero one
    priorities = [prioritized.sampler.total_priority]
    assert abs(priorities[0] - 4.0) < 1e-3
    assert set(prioritized.sample(2000).tolist()) == {40.0, 41.0, 42.0, 43.0}


def test_the_other_slice_sampler_sees_the_trajectories_written_through_one_buffer() -> None:
    storage = LazyTensorStorage(32)
    writer = TensorDictReplayBuffer(storage=storage)
    slices = TensorDictReplayBuffer(storage=storage, sampler=SliceSampler(slice_len=4,
                                                                          traj_key="episode"))
    writer.extend(TensorDict({"episode": torch.tensor([0] * 8 + [1] * 8),
                              "obs": torch.arange(16.0)}, [16]))
    assert set(slices.sample(32)["episode"].tolist()) == {0, 1}
    writer[0:8] = TensorDict({"episode": torch.full((8,), 7), "obs": torch.zeros(8)}, [8])
    assert set(slices.sample(64)["episode"].tolist()) == {7, 1}


def test_a_restore_through_one_buffer_gives_the_other_every_row_at_the_max_priority() -> None:
    storage = LazyTensorStorage(8)
    writer = TensorDictReplayBuffer(storage=storage)
    prioritized = TensorDictReplayBuffer(storage=storage,
                                         sampler=PrioritizedSampler(8, alpha=1.0, beta=0.4))
    writer.extend(TensorDict({"obs": torch.arange(6.0)}, [6]))
    state = writer.state_dict()
    writer.empty()
    assert prioritized.sampler.total_priority == 0.0
    writer.load_state_dict(state)
    assert abs(prioritized.sampler.total_priority - 6.0) < 1e-3
    assert set(prioritized.sample(500)["obs"].tolist()) == set(range(6))


def test_reads_through_one_buffer_never_see_a_batch_half_written_through_the_other() -> None:
    keys = [f"k{i}" for i in range(8)]
    rows, width = 512, 256  # large enough that a write of every key takes a while

    def batch(value: float) -> TensorDict:
        return TensorDict({k: torch.full((rows, width), value) for k in keys}, [rows])

    storage = LazyTensorStorage(rows)
    writer = TensorDictReplayBuffer(storage=storage)
    reader = TensorDictReplayBuffer(storage=storage)
    writer.extend(batch(0.0))
    stop = threading.Event()
    torn = 0

    def write() -> None:
        value = 0.0
        while not stop.is_set():
            value += 1.0
            writer.extend(batch(value))

    thread = threading.Thread(target=write)
    thread.start()
    try:
        for _ in range(200):
            whole = reader[:]  # every row, in one locked read
            first = whole[keys[0]][0, 0]
            torn += sum(int((whole[k] != first).any()) for k in keys)
    finally:
        stop.set()
        thread.join()
    assert torn == 0


class _EditsHeard(RandomSampler):
    """A uniform sampler recording the in-place edits it is told of."""

    def __init__(self) -> None:
        super().__init__()
        self.edited: list[list | None] = []

    def mark_edited(self, keys: list | None = None) -> None:
        self.edited.append(None if keys is None else [str(k) for k in keys])


def test_in_place_edits_through_one_buffer_reach_the_other_sampler() -> None:
    storage = LazyTensorStorage(8)
    writer = TensorDictReplayBuffer(storage=storage,
                                    writer=RoundRobinWriter(track_generations=True))
    heard = _EditsHeard()
    reader = TensorDictReplayBuffer(storage=storage, sampler=heard)
    slots = writer.extend(TensorDict({"obs": torch.zeros(4), "v": torch.zeros(4)}, [4]))
    writer.set_("obs", torch.ones(4))
    writer.set_at_("obs", torch.full((2,), 2.0), torch.tensor([0, 1]))
    writer.update_(TensorDict({"v": torch.ones(4)}, [4]))
    result = writer.update_if_present(index=slots, generation=writer.writer.generations_of(slots),
                                      patch={"v": torch.full((4,), 5.0)})
    assert bool(result.updated.all())
    assert heard.edited == [["obs"], ["obs"], ["v"], ["v"]]
    assert reader[:]["v"].tolist() == [5.0] * 4


def test_mark_update_takes_the_coordinates_of_a_storage_of_two_dims() -> None:
    heard: list[list[int]] = []

    class Told(RandomSampler):
        def mark_update(self, slots: torch.Tensor) -> None:
            heard.append(slots.tolist())

    rb = ReplayBuffer(storage=LazyTensorStorage(8, ndim=2), sampler=Told())
    rb.extend(torch.zeros(2, 3))  # 2 envs x 3 steps, stored time-major: shape [4, 2]
    assert rb.storage.shape == (4, 2)
    rb.mark_update((torch.tensor([2, 0]), torch.tensor([1, 1])))  # (step, env)
    assert heard == [[5, 1]]  # flat C-order slots
    with pytest.raises(IndexError, match="one entry per item"):
        rb.mark_update((torch.tensor([1, 0]), torch.tensor([1])))
    with pytest.raises(IndexError, match="out of the storage's shape"):
        rb.mark_update((torch.tensor([0]), torch.tensor([2])))
    assert heard == [[5, 1]]


def test_a_slice_sampler_cuts_the_ring_at_the_newest_write_of_another_buffer() -> None:
    # found by fuzzing: the slice buffer was told of the other buffer's write as an index
    # assignment and kept cutting the ring at its own last write, splitting the newest
    # trajectory ("did not find a single trajectory with sufficient length")
    storage = LazyTensorStorage(4)
    writer = TensorDictReplayBuffer(storage=storage, batch_size=4)
    slices = TensorDictReplayBuffer(storage=storage, batch_size=6,
                                    sampler=SliceSampler(slice_len=3, traj_key="traj"))

    def steps(n: int, traj: int) -> TensorDict:
        return TensorDict(obs=torch.arange(n, dtype=torch.float), traj=torch.full((n,), traj),
                          batch_size=[n])

    slices.extend(steps(1, 1))
    slices.extend(steps(4, 33))  # slots 1, 2, 3, 0
    assert slices.sample()["traj"].tolist() == [33] * 6
    assert writer.extend(steps(3, 34)).tolist() == [0, 1, 2]
    sample = slices.sample()
    assert sample["index"].tolist() == [0, 1, 2, 0, 1, 2]
    assert sample["traj"].tolist() == [34] * 6
