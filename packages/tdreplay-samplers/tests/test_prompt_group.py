"""PromptGroupSampler: whole groups per batch, strategies, cache, state and bad input."""

from __future__ import annotations

import pickle
import threading
import warnings
from pathlib import Path

import pytest
import torch
from tensordict import NonTensorStack, TensorDict

from tdreplay.core import ListStorage, ReplayBuffer
from tdreplay.samplers import PromptGroupSampler
from tdreplay.samplers.prompt_group import max_variance_subset
from tdreplay.storages import LazyStackStorage, LazyTensorStorage


def _rb(sampler: PromptGroupSampler, batch_size: int, size: int = 100,
        storage: str = "stack") -> ReplayBuffer:
    store = LazyStackStorage(size) if storage == "stack" else LazyTensorStorage(size)
    rb = ReplayBuffer(storage=store, sampler=sampler, batch_size=batch_size)
    rb.set_rng(torch.Generator().manual_seed(0))
    return rb


def _data(prompts: list[int], **extra: torch.Tensor) -> TensorDict:
    n = len(prompts)
    return TensorDict({"prompt": torch.tensor(prompts), "id": torch.arange(n), **extra}, [n])


@pytest.mark.parametrize("storage", ["stack", "tensor"])
def test_batches_are_whole_groups(storage: str) -> None:
    rb = _rb(PromptGroupSampler(num_groups=2, group_key="prompt"), 6, storage=storage)
    rb.extend(_data([0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]))
    for _ in range(10):
        prompts = rb.sample()["prompt"].reshape(2, 3)
        assert (prompts == prompts[:, :1]).all()          # laid out group after group
        assert prompts[0, 0] != prompts[1, 0]             # two different groups


def test_samples_per_group_and_string_keys() -> None:
    rb = _rb(PromptGroupSampler(samples_per_group=2, group_key="q"), 4)
    rb.extend(TensorDict({"q": NonTensorStack(*"aabbcc"), "v": torch.arange(6)}, [6]))
    sample = rb.sample()
    q = list(sample["q"])
    assert q[0] == q[1] and q[2] == q[3] and q[0] != q[2]


def test_list_storage_of_tensordicts_works_plain_items_refused() -> None:
    rb = ReplayBuffer(storage=ListStorage(10),
                      sampler=PromptGroupSampler(num_groups=1, group_key="prompt"),
                      batch_size=2)
    rb.extend(_data([4, 4, 5, 5]))
    assert rb.sample()["prompt"].unique().numel() == 1
    plain = ReplayBuffer(storage=ListStorage(10),
                         sampler=PromptGroupSampler(num_groups=1), batch_size=2)
    plain.extend([1, 2])
    with pytest.raises(TypeError, match="tensor collection"):
        plain.sample()


def test_recency_reward_variance() -> None:
    rec = _rb(PromptGroupSampler(samples_per_group=2, group_key="prompt", strategy="recency"),
              2, size=4)
    rec.extend(_data([0, 0, 0, 0]))
    rec.add(TensorDict({"prompt": torch.tensor(0), "id": torch.tensor(4)}, []))
    assert sorted(rec.sample()["id"].tolist()) == [3, 4]

    rewards = torch.tensor([1.0, 2.0, 3.0, 9.0, 8.0, 7.0])
    rew = _rb(PromptGroupSampler(samples_per_group=2, group_key="prompt", strategy="reward"), 4)
    rew.extend(_data([0, 0, 0, 1, 1, 1], reward=rewards))
    rew.sampler.reward_key = "reward"
    assert sorted(rew.sample()["reward"].tolist()) == [2.0, 3.0, 8.0, 9.0]

    var = _rb(PromptGroupSampler(num_groups=1, group_key="prompt", strategy="variance",
                                 reward_key="r"), 3)
    var.extend(_data([0, 0, 0, 0], r=torch.tensor([2.0, -7.0, 10.0, 1.0])))
    assert sorted(var.sample()["r"].tolist()) == [-7.0, 2.0, 10.0]
    assert sorted(max_variance_subset(torch.tensor([0.0, 0.0, 1.0, 1.0]), 2).tolist()) in \
        ([0, 2], [0, 3], [1, 2], [1, 3])


def test_small_groups_warn_once_and_complete_with_replacement() -> None:
    rb = _rb(PromptGroupSampler(samples_per_group=4, group_key="prompt"), 8)
    rb.extend(_data([3, 3]))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sample = rb.sample()
        rb.sample()
    assert sample.shape == (8,) and set(sample["prompt"].tolist()) == {3}
    assert sum("with replacement" in str(w.message) for w in caught) == 1


def test_cache_invalidated_by_writes() -> None:
    rb = _rb(PromptGroupSampler(num_groups=1, group_key="prompt"), 2)
    rb.extend(_data([7, 7]))
    rb.sample()
    rb.extend(_data([9, 9]))
    seen = set()
    for _ in range(20):
        seen.update(rb.sample()["prompt"].tolist())
    assert seen == {7, 9}


@pytest.mark.parametrize("kwargs,err,match", [
    ({}, TypeError, "Exactly one"),
    ({"num_groups": 2, "samples_per_group": 2}, TypeError, "Exactly one"),
    ({"num_groups": 2, "strategy": "bogus"}, ValueError, "strategy"),
    ({"num_groups": 0}, ValueError, "num_groups"),
    ({"num_groups": True}, TypeError, "num_groups"),
    ({"samples_per_group": 1.5}, TypeError, "samples_per_group"),
    ({"num_groups": 1, "cache_groups": "yes"}, TypeError, "cache_groups"),
])
def test_bad_arguments(kwargs: dict, err: type, match: str) -> None:
    with pytest.raises(err, match=match):
        PromptGroupSampler(**kwargs)


def test_bad_batch_and_storage() -> None:
    rb = _rb(PromptGroupSampler(num_groups=3, group_key="prompt"), 8)
    rb.extend(_data([0, 0, 1, 1, 2, 2]))
    with pytest.raises(ValueError, match="divisible by num_groups=3"):
        rb.sample()
    two_d = ReplayBuffer(storage=LazyTensorStorage(10, ndim=2),
                         sampler=PromptGroupSampler(num_groups=1, group_key="prompt"))
    two_d.extend(TensorDict({"prompt": torch.zeros(2, 3, dtype=torch.long)}, [2, 3]))
    with pytest.raises(NotImplementedError, match="ndim=2"):
        two_d.sample(2)
    rew = _rb(PromptGroupSampler(num_groups=1, group_key="prompt", strategy="reward",
                                 reward_key="r"), 2)
    rew.extend(TensorDict({"prompt": torch.tensor([0, 0]), "r": NonTensorStack("x", "y")}, [2]))
    with pytest.raises(TypeError, match="requires reward_key"):
        rew.sample()


def test_state_round_trip_through_buffer(tmp_path: Path) -> None:
    def make() -> ReplayBuffer:
        return _rb(PromptGroupSampler(samples_per_group=2, group_key="prompt",
                                      strategy="recency"), 2, size=4)

    rb = make()
    rb.extend(_data([0, 0, 0, 0]))
    rb.add(TensorDict({"prompt": torch.tensor(0), "id": torch.tensor(4)}, []))
    state = rb.sampler.state_dict()
    assert state["recency_clock"] == 5
    restored = make()
    restored.load_state_dict(rb.state_dict())
    assert sorted(restored.sample()["id"].tolist()) == [3, 4]
    # a bare sampler restored from the state draws from the storage, read as TorchRL reads it
    bare = PromptGroupSampler(samples_per_group=2, group_key="prompt", strategy="recency")
    bare.load_state_dict(state)
    index, _ = bare.sample(rb.storage, 2)
    assert sorted(rb.storage[index]["id"].tolist()) == [3, 4]
    rb.dumps(tmp_path)
    again = make()
    again.loads(tmp_path)
    assert sorted(again.sample()["id"].tolist()) == [3, 4]
    copy = pickle.loads(pickle.dumps(rb))
    assert sorted(copy.sample()["id"].tolist()) == [3, 4]


def test_bad_state_refused_unchanged() -> None:
    s = PromptGroupSampler(samples_per_group=2, strategy="recency")
    s.extend(torch.arange(3))
    before = s.state_dict()
    for bad in ({"position_recency": torch.zeros(2)}, {"position_recency": [1], "recency_clock": 1},
                {"position_recency": torch.zeros(2, dtype=torch.long), "recency_clock": -1}):
        with pytest.raises(ValueError):
            s.load_state_dict(bad)
    after = s.state_dict()
    assert torch.equal(after["position_recency"], before["position_recency"])
    assert after["recency_clock"] == before["recency_clock"] == 3
    assert PromptGroupSampler(num_groups=1).state_dict() == {}


def test_threads_extend_and_sample() -> None:
    rb = _rb(PromptGroupSampler(num_groups=2, group_key="prompt"), 4, size=1000)
    rb.extend(_data([0, 0, 1, 1]))
    errors: list[BaseException] = []

    def writer() -> None:
        for i in range(50):
            rb.extend(_data([i % 5] * 2))

    def reader() -> None:
        try:
            for _ in range(50):
                p = rb.sample()["prompt"]
                assert p[0] == p[1] and p[2] == p[3]
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=writer), threading.Thread(target=reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
