"""prefill_replay_buffer: a dataset's items copied once each, in storage order, chunk by chunk."""

from __future__ import annotations

import functools

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ListStorage, ReplayBuffer, TensorDictReplayBuffer
from tdreplay.datasets import (
    MinariExperienceReplay,
    prefill_replay_buffer,
    register_dataset,
    registry,
)
from tdreplay.samplers import SliceSampler
from tdreplay.storages import LazyTensorStorage

CARTPOLE_ID = "cartpole/tiny-v0"  # the id the conftest's cartpole fixture builds


@pytest.fixture(autouse=True)
def restore_registry():
    saved = dict(registry._REGISTRY)
    yield
    registry._REGISTRY.clear()
    registry._REGISTRY.update(saved)


class Counting(ReplayBuffer):
    """A buffer recording the size of every ``extend``."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.chunks: list[int] = []

    def extend(self, data, *args, **kwargs):
        self.chunks.append(len(data))
        return super().extend(data, *args, **kwargs)


def td_dataset(n: int = 500) -> TensorDictReplayBuffer:
    data = TensorDictReplayBuffer(storage=LazyTensorStorage(n))
    data.extend(TensorDict({"obs": torch.arange(n), "twice": 2 * torch.arange(n)}, [n]))
    return data


@pytest.mark.parametrize("n_samples, chunk_size, chunks", [
    (None, 1000, [500]), (None, 64, [64] * 7 + [52]), (200, 64, [64, 64, 64, 8]),
    (200, 200, [200]), (200, 1, [1] * 200), (10_000, 300, [300, 200]), (500, 500, [500]),
])
def test_copies_the_first_items_in_storage_order_once_each(n_samples, chunk_size, chunks):
    dataset = td_dataset()
    rb = Counting(storage=LazyTensorStorage(1000))
    assert prefill_replay_buffer(rb, dataset, n_samples=n_samples, chunk_size=chunk_size) is rb
    total = min(n_samples or 500, 500)
    assert rb.chunks == chunks and len(rb) == total
    copied = rb[:]
    assert sorted(copied.keys()) == ["obs", "twice"]
    assert copied["obs"].tolist() == list(range(total))
    assert torch.equal(copied["twice"], 2 * copied["obs"])
    assert len(dataset) == 500 and dataset.write_count == 500  # the dataset is only read


def test_zero_samples_copies_nothing():
    rb = Counting(storage=LazyTensorStorage(10))
    assert prefill_replay_buffer(rb, td_dataset(), n_samples=0) is rb
    assert rb.chunks == [] and len(rb) == 0


def test_a_tensordict_buffer_target_drops_nothing_but_index():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), batch_size=4)
    prefill_replay_buffer(rb, td_dataset(50), chunk_size=16)
    assert len(rb) == 50 and rb[:]["obs"].tolist() == list(range(50))
    sample = rb.sample()
    assert torch.equal(sample["index"], sample["obs"])  # slot i holds dataset item i


def test_tensor_items():
    dataset = ReplayBuffer(storage=LazyTensorStorage(30))
    dataset.extend(torch.arange(30.0).reshape(15, 2))
    rb = ReplayBuffer(storage=LazyTensorStorage(100))
    prefill_replay_buffer(rb, dataset, chunk_size=4)
    assert torch.equal(rb[:], torch.arange(30.0).reshape(15, 2))


def test_list_items():
    dataset = ReplayBuffer(storage=ListStorage(20))
    dataset.extend([{"step": i} for i in range(12)])
    rb = Counting(storage=ListStorage(100))
    prefill_replay_buffer(rb, dataset, n_samples=10, chunk_size=3)
    assert rb.chunks == [3, 3, 3, 1]
    assert rb[:] == [{"step": i} for i in range(10)]


def test_a_full_ring_is_copied_in_storage_order():
    dataset = ReplayBuffer(storage=LazyTensorStorage(5))
    dataset.extend(torch.arange(7))  # slots hold 5, 6, 2, 3, 4
    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    prefill_replay_buffer(rb, dataset, chunk_size=2)
    assert rb[:].tolist() == [5, 6, 2, 3, 4]


def test_minari_steps_are_copied_whole_and_trajectories_stay_contiguous(cartpole, root):
    data = MinariExperienceReplay(CARTPOLE_ID, 4, root=root, load_from_local_minari=True)
    n = len(data)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(n + 10),
                                sampler=SliceSampler(slice_len=3, traj_key="episode"),
                                batch_size=6)
    prefill_replay_buffer(rb, data, chunk_size=7)
    assert len(rb) == n
    copied, source = rb[:], data.storage[:]
    assert set(copied.keys(True, True)) == set(source.keys(True, True))
    for key in source.keys(True, True):
        assert torch.equal(copied[key], source[key]), key
    episodes = copied["episode"].tolist()
    # each episode is one run of rows, in order
    runs = [e for i, e in enumerate(episodes) if i == 0 or episodes[i - 1] != e]
    assert runs == sorted(set(episodes)) == list(range(5))
    batch = rb.sample().reshape(2, 3)
    assert (batch["episode"] == batch["episode"][:, :1]).all()
    # consecutive steps: each step's next observation is the following step's observation
    assert torch.equal(batch["next", "observation"][:, :-1], batch["observation"][:, 1:])


def test_minari_whole_episodes(cartpole, root):
    episodes = MinariExperienceReplay(CARTPOLE_ID, 2, root=root, load_from_local_minari=True,
                                      split_trajs=True)
    max_len = episodes.metadata["max_len"]
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10))
    prefill_replay_buffer(rb, episodes, chunk_size=2)
    assert len(rb) == 5
    assert rb[:].batch_size == (5, max_len)
    assert torch.equal(rb[:]["observation"], episodes.storage[:]["observation"])
    assert torch.equal(rb[:]["mask"], episodes.storage[:]["mask"])


def test_a_string_dataset_is_loaded_with_the_chunk_size_as_batch_size(cartpole, root):
    built = []

    def local_minari(dataset_id, **kwargs):
        built.append((dataset_id, kwargs))
        return MinariExperienceReplay(dataset_id, root=root, load_from_local_minari=True,
                                      **kwargs)

    register_dataset("localminari", local_minari)
    rb = Counting(storage=LazyTensorStorage(100))
    prefill_replay_buffer(rb, f"localminari:{CARTPOLE_ID}", n_samples=20, chunk_size=8)
    assert built == [(CARTPOLE_ID, {"batch_size": 8})]
    assert rb.chunks == [8, 8, 4]
    expected = MinariExperienceReplay(CARTPOLE_ID, 8, root=root, download=False)
    assert torch.equal(rb[:]["observation"], expected.storage[:20]["observation"])


@pytest.mark.parametrize("kwargs, error, match", [
    ({"chunk_size": 0}, ValueError, "chunk_size must be >= 1, got 0"),
    ({"chunk_size": -4}, ValueError, "chunk_size must be >= 1, got -4"),
    ({"chunk_size": True}, TypeError, "chunk_size must be an int, got bool"),
    ({"chunk_size": 2.0}, TypeError, "chunk_size must be an int, got float"),
    ({"chunk_size": "8"}, TypeError, "chunk_size must be an int, got str"),
    ({"n_samples": -1}, ValueError, "n_samples must be >= 0, got -1"),
    ({"n_samples": False}, TypeError, "n_samples must be an int, got bool"),
    ({"n_samples": 1.5}, TypeError, "n_samples must be an int, got float"),
])
def test_bad_counts_name_the_argument_and_copy_nothing(kwargs, error, match):
    rb = Counting(storage=LazyTensorStorage(1000))
    with pytest.raises(error, match=match):
        prefill_replay_buffer(rb, td_dataset(), **kwargs)
    assert rb.chunks == [] and len(rb) == 0


def test_bad_counts_are_refused_before_a_string_dataset_is_built():
    built = []
    register_dataset("neverbuilt", lambda dataset_id, **kw: built.append(kw))
    with pytest.raises(ValueError, match="chunk_size"):
        prefill_replay_buffer(ReplayBuffer(storage=ListStorage(4)), "neverbuilt:x",
                              chunk_size=0)
    assert built == []


def test_bad_buffers_and_datasets_are_type_errors():
    with pytest.raises(TypeError, match="rb must be a replay buffer \\(with extend\\(\\)\\), "
                                        "got tuple"):
        prefill_replay_buffer((), td_dataset())
    rb = ReplayBuffer(storage=ListStorage(4))
    for dataset in (42, object(), None):
        with pytest.raises(TypeError, match="dataset must be a replay buffer"):
            prefill_replay_buffer(rb, dataset)
    with pytest.raises(NotImplementedError, match="tdreplay has no D4RLExperienceReplay"):
        prefill_replay_buffer(rb, "d4rl:hopper-medium-v2")
    assert len(rb) == 0


def test_numpy_counts_are_accepted():
    import numpy as np

    rb = Counting(storage=LazyTensorStorage(100))
    prefill_replay_buffer(rb, td_dataset(50), n_samples=np.int64(30), chunk_size=np.int32(16))
    assert rb.chunks == [16, 14]


def test_a_partial_factory_registration_works_for_strings(cartpole, root):
    register_dataset("cartpoles", functools.partial(MinariExperienceReplay, root=root,
                                                    load_from_local_minari=True))
    rb = ReplayBuffer(storage=LazyTensorStorage(200))
    prefill_replay_buffer(rb, f"cartpoles:{CARTPOLE_ID}")
    assert len(rb) == MinariExperienceReplay(CARTPOLE_ID, 1, root=root,
                                             download=False).metadata["total_steps"]


def _episodes() -> TensorDictReplayBuffer:
    """Episodes of 3, 1 and 5 steps (ids 0, 1, 2), the first terminated, the others
    truncated."""
    ids = torch.tensor([0, 0, 0, 1, 2, 2, 2, 2, 2])
    ends = torch.tensor([False, False, True, True, False, False, False, False, True])
    terminated = torch.zeros(9, 1, dtype=torch.bool)
    terminated[2] = True
    data = TensorDictReplayBuffer(storage=LazyTensorStorage(9))
    data.extend(TensorDict({"episode": ids, "next": {
        "done": ends.unsqueeze(-1), "terminated": terminated,
        "truncated": ends.unsqueeze(-1) & ~terminated}}, [9]))
    return data


@pytest.mark.parametrize("chunk_size", [2, 100])
def test_a_copy_that_stops_inside_an_episode_ends_it_truncated(chunk_size):
    # (the last item copied ended nothing: the online steps written after it continued the
    # dataset's episode 2, and 2 of 20 slices joined them)
    dataset = _episodes()
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(30))
    prefill_replay_buffer(rb, dataset, n_samples=6, chunk_size=chunk_size)
    copied = rb[:]
    assert copied["next", "truncated"].reshape(-1).tolist() == [False] * 3 + [True, False, True]
    assert copied["next", "done"].reshape(-1).tolist() == [False, False, True, True, False, True]
    assert copied["next", "terminated"].reshape(-1).tolist() == [False, False, True] + [False] * 3
    assert not bool(dataset[5]["next", "done"].any())  # the dataset is unchanged
    # a copy that ends where an episode ends, and a whole copy, change no flag
    for n in (4, None):
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(30))
        prefill_replay_buffer(rb, dataset, n_samples=n, chunk_size=chunk_size)
        assert torch.equal(rb[:]["next", "done"], dataset[:len(rb)]["next", "done"])
