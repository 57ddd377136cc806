"""TorchRL 0.14.1's own docstring examples (torchrl/data/replay_buffers/...) run on tdreplay.

Each test is one of those examples with ``torchrl.data`` changed to ``tdreplay.data``; the
expected values are the ones TorchRL 0.14.1 gives for the same program (observed by running
it, seeded with ``torch.manual_seed(0)``), written as literals. TorchRL is not imported here.
Where tdreplay differs on purpose (``docs/guides/migrating.rst`` lists it), the test pins
tdreplay's behaviour and says so. The divergences these examples found (float trajectory
ids, a failed slice sample breaking the next, ``submit_update_if_present``, ``end_streams``,
``StreamingSliceSampler``) are fixed.
"""

from __future__ import annotations

import pytest
import torch
from tensordict import LazyStackedTensorDict, TensorDict

from tdreplay.data import (
    CompressedListStorage,
    ConsumingSampler,
    HERReplayBuffer,
    LazyMemmapStorage,
    LazyStackStorage,
    LazyTensorStorage,
    ListStorage,
    PrioritizedReplayBuffer,
    PrioritizedSampler,
    PrioritizedSliceSampler,
    RandomSampler,
    ReplayBuffer,
    ReplayBufferEnsemble,
    RoundRobinWriter,
    SamplerWithoutReplacement,
    Sequence,
    SliceSampler,
    SliceSamplerWithoutReplacement,
    TensorDictMaxValueWriter,
    TensorDictReplayBuffer,
    TensorDictRoundRobinWriter,
    TensorStorage,
    find_start_stop_traj,
)
from tdreplay.data.replay_buffers import Transition
from tdreplay.data.replay_buffers.samplers import PromptGroupSampler


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _float_episode_data():
    """The two episodes of TorchRL's ``SliceSampler`` example (float episode ids)."""
    ep_1 = TensorDict({"obs": torch.arange(100), "episode": torch.zeros(100)}, batch_size=[100])
    ep_2 = TensorDict({"obs": torch.arange(4), "episode": torch.ones(4)}, batch_size=[4])
    return ep_1, ep_2


def _outcome(fn):
    """What a call did: ``("ok", None)`` or ``("raised", exception type)``."""
    try:
        fn()
    except Exception as err:  # noqa: BLE001 - the type is the result
        return ("raised", type(err))
    return ("ok", None)


# --------------------------------------------------------------------------------------
# Examples whose results tdreplay reproduces
# --------------------------------------------------------------------------------------


def test_her_replay_buffer_example_shapes():
    def reward_fn(td):
        dist = (td["achieved_goal"] - td["desired_goal"]).norm(dim=-1, keepdim=True)
        return (dist < 0.05).float()

    rb = HERReplayBuffer(reward_fn=reward_fn, storage=LazyMemmapStorage(10_000), batch_size=256)
    for i in range(4):
        td = TensorDict(
            {
                "observation": torch.randn(4),
                "desired_goal": torch.zeros(3),
                "achieved_goal": torch.randn(3),
                "action": torch.randn(2),
                "next": {
                    "observation": torch.randn(4),
                    "desired_goal": torch.zeros(3),
                    "achieved_goal": torch.randn(3),
                    "reward": torch.zeros(1),
                    "done": torch.tensor([i == 3]),
                },
            },
            batch_size=[],
        )
        rb.add(td)
    batch = rb.sample(4)
    # TorchRL 0.14.1: torch.Size([4, 3]) and torch.Size([4, 1])
    assert batch["desired_goal"].shape == (4, 3)
    assert batch["next", "reward"].shape == (4, 1)
    assert batch["next", "reward"].dtype == torch.float32
    assert set(batch["next", "reward"].unique().tolist()) <= {0.0, 1.0}


def test_replay_buffer_stats_example():
    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    # TorchRL 0.14.1: extend returns tensor([0, 1, 2, 3, 4]); stats gives 5 5 10
    assert rb.extend(torch.arange(5)).tolist() == [0, 1, 2, 3, 4]
    snapshot = rb.stats()
    assert (snapshot["size"], snapshot["write_count"], snapshot["capacity"]) == (5, 5, 10)


def test_transition_sample_unit_example():
    rb = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=4, sample_unit=Transition())
    rb.extend(torch.arange(10))
    # TorchRL 0.14.1: torch.Size([4])
    assert rb.sample().shape == (4,)


def test_sequence_sample_unit_example():
    rb = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=2, sample_unit=Sequence(length=3))
    done = torch.zeros(10, 1, dtype=torch.bool)
    done[4] = done[9] = True
    rb.extend(
        TensorDict(
            {"obs": torch.arange(10, dtype=torch.float32), ("next", "done"): done},
            batch_size=[10],
        )
    )
    sample, info = rb.sample(return_info=True)
    # TorchRL 0.14.1 gives every value below
    assert sample["obs"].shape == (6,)
    assert sorted(info.keys()) == [
        "anchor_index",
        "index",
        "learning_mask",
        "sequence_id",
        "step_in_sequence",
        "validity_mask",
    ]
    unit = Sequence(length=2, burn_in=1, bootstrap=1)
    index, info = unit.expand(torch.tensor([5]), {}, rb.storage)
    assert index.tolist() == [5, 5, 6, 7]
    assert info["learning_mask"].tolist() == [False, True, True, False]
    assert info["validity_mask"].tolist() == [False, True, True, True]
    index, _ = Sequence(length=3, dilation=2).expand(torch.tensor([0]), {}, rb.storage)
    assert index.tolist() == [0, 2, 4]


def test_prompt_group_sampler_example():
    rb = ReplayBuffer(
        storage=LazyStackStorage(100),
        sampler=PromptGroupSampler(num_groups=2, group_key="prompt"),
        batch_size=8,
    )
    data = TensorDict(
        {
            "prompt": torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]),
            "reward": torch.arange(12.0),
        },
        batch_size=[12],
    )
    rb.extend(data)
    sample = rb.sample()
    # TorchRL 0.14.1: 2 and 8
    assert int(sample["prompt"].unique().numel()) == 2
    assert int(sample.shape[0]) == 8


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({}, RandomSampler),  # TorchRL 0.14.1: True
        ({"replacement": False}, SamplerWithoutReplacement),  # TorchRL 0.14.1: True
        ({"replacement": False, "drop_last": True}, SamplerWithoutReplacement),  # True
    ],
)
def test_random_sampler_dispatch_example(kwargs, expected):
    assert isinstance(RandomSampler(**kwargs), expected)


def test_consuming_sampler_example():
    rb = ReplayBuffer(storage=ListStorage(10), sampler=ConsumingSampler(), batch_size=3)
    # TorchRL 0.14.1: tensor([0, 1, 2, 3]), then 3 and 1
    assert rb.extend([torch.tensor(i) for i in range(4)]).tolist() == [0, 1, 2, 3]
    sample = rb.sample()
    assert len(sample) == 3
    assert len(rb) == 1


def test_round_robin_writer_generations_example():
    rb = ReplayBuffer(storage=LazyTensorStorage(4), writer=RoundRobinWriter(track_generations=True))
    index = rb.extend(torch.arange(4))
    # TorchRL 0.14.1: tensor([0, 0, 0, 0]) then tensor([1, 1, 0, 0])
    assert rb.writer.generations_of(index).tolist() == [0, 0, 0, 0]
    rb.extend(torch.arange(4, 6))
    assert rb.writer.generations_of(index).tolist() == [1, 1, 0, 0]


def test_update_if_present_example():
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(4), writer=TensorDictRoundRobinWriter(track_generations=True)
    )
    index = rb.extend(TensorDict({"value": torch.zeros(4)}, batch_size=[4]))
    generation = rb.writer.generations_of(index)
    result = rb.update_if_present(
        index=index, generation=generation, patch={"value": torch.ones(4)}
    )
    # TorchRL 0.14.1: updated all True, version_rejected None, 4 updated, 0 stale
    assert result.updated.tolist() == [True] * 4
    assert result.version_rejected is None
    assert (result.updated_count, result.stale_count) == (4, 0)
    assert rb[:]["value"].tolist() == [1.0] * 4


def test_find_start_stop_traj_example():
    end = torch.zeros(10, dtype=torch.bool)
    end[2] = end[7] = True
    start, stop, lengths = find_start_stop_traj(end=end, at_capacity=True, cursor=4)
    # TorchRL 0.14.1: [8, 3, 5], [2, 4, 7], [5, 2, 3]
    assert start.squeeze(-1).tolist() == [8, 3, 5]
    assert stop.squeeze(-1).tolist() == [2, 4, 7]
    assert lengths.tolist() == [5, 2, 3]
    trajectory = torch.tensor([5, 5, 5, 0, 0, 1, 1, 1, 5, 5])
    start, stop, lengths = find_start_stop_traj(trajectory=trajectory, at_capacity=True)
    # TorchRL 0.14.1: the same three tensors
    assert (start.squeeze(-1).tolist(), stop.squeeze(-1).tolist(), lengths.tolist()) == (
        [8, 3, 5],
        [2, 4, 7],
        [5, 2, 3],
    )


@pytest.mark.parametrize("storage_cls", [TensorStorage, LazyTensorStorage])
def test_tensor_storage_get_set_example(storage_cls):
    data = TensorDict(
        {"some data": torch.randn(10, 11), ("some", "nested", "data"): torch.randn(10, 11, 12)},
        [10, 11],
    )
    if storage_cls is TensorStorage:
        storage = TensorStorage(data)
    else:
        storage = LazyTensorStorage(100)
        storage.set(range(10), data)
    # TorchRL 0.14.1: len 10; get(0) is a TensorDict of batch [11] with the two entries
    assert len(storage) == 10
    row = storage.get(0)
    assert row.batch_size == (11,)
    assert row["some", "nested", "data"].shape == (11, 12)
    assert torch.equal(row["some data"], data[0]["some data"])
    storage.set(0, storage.get(0).zero_())
    assert (storage.get(0)["some data"] == 0).all()


def test_max_value_writer_example():
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(1),
        sampler=SamplerWithoutReplacement(),
        batch_size=1,
        writer=TensorDictMaxValueWriter(rank_key="key"),
    )

    def batch(lo, hi):
        return TensorDict(
            {"key": torch.arange(lo, hi), "obs": torch.arange(lo, hi)}, batch_size=hi - lo
        )

    # TorchRL 0.14.1: extend returns [-1]*9 + [0] and the sample holds 9, then 19, then
    # [-1]*10 (nothing beats 19) and still 19
    assert rb.extend(batch(0, 10)).tolist() == [-1] * 9 + [0]
    assert rb.sample().get("obs").item() == 9
    assert rb.extend(batch(10, 20)).tolist() == [-1] * 9 + [0]
    assert rb.sample().get("obs").item() == 19
    assert rb.extend(batch(0, 10)).tolist() == [-1] * 10
    assert rb.sample().get("obs").item() == 19


def test_max_value_writer_empty_buffer_sample_raises():
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(max_size=100), writer=TensorDictMaxValueWriter(rank_key="reward")
    )
    # TorchRL 0.14.1: RuntimeError "Cannot sample from an empty storage."
    with pytest.raises(RuntimeError, match="Cannot sample from an empty storage"):
        rb.sample(5)


def test_prioritized_replay_buffer_example_weights():
    rb = PrioritizedReplayBuffer(alpha=0.7, beta=0.9, storage=LazyTensorStorage(10))
    rb.extend(torch.arange(10))
    _, info = rb.sample(5, return_info=True)
    # TorchRL 0.14.1 (and its docstring): every weight 1 while all priorities are equal
    assert info["priority_weight"].tolist() == [1.0] * 5
    rb.update_priority(torch.tensor([2, 7, 4, 3, 5]), torch.ones(5) * 5)
    sample, info = rb.sample(200, return_info=True)
    updated = torch.isin(info["index"], torch.tensor([2, 7, 4, 3, 5]))
    # TorchRL 0.14.1: 0.36278465 for an item of priority 5, 1.0 for one of the max-weight priority 1
    assert torch.allclose(info["priority_weight"][updated], torch.tensor(0.36278465))
    assert torch.allclose(info["priority_weight"][~updated], torch.tensor(1.0))
    assert info["priority_weight"].dtype == torch.float32


def test_prioritized_sampler_zero_priority_example():
    rb = ReplayBuffer(
        storage=LazyTensorStorage(10),
        sampler=PrioritizedSampler(max_capacity=10, alpha=1.0, beta=1.0),
    )
    priority = torch.tensor([0, 1000])
    # TorchRL 0.14.1: add returns 0 then 1
    assert (
        rb.add(TensorDict({"reward": 0, "obs": [0], "action": [0], "priority": priority[0]}, []))
        == 0
    )
    assert (
        rb.add(TensorDict({"reward": 1, "obs": [1], "action": [2], "priority": priority[1]}, []))
        == 1
    )
    rb.update_priority(torch.tensor([0, 1]), priority=priority)
    sample, info = rb.sample(10, return_info=True)
    # TorchRL 0.14.1: index all 1, priority_weight all 1e-11, sample fields [10] / [10, 1] int64
    assert info["index"].tolist() == [1] * 10
    assert torch.allclose(info["priority_weight"], torch.full((10,), 1e-11))
    assert sample["obs"].shape == (10, 1) and sample["obs"].dtype == torch.int64
    assert sample["reward"].shape == (10,)


def test_prioritized_slice_sampler_example_weights():
    sampler = PrioritizedSliceSampler(max_capacity=9, num_slices=3, alpha=0.7, beta=0.9)
    rb = TensorDictReplayBuffer(storage=LazyMemmapStorage(9), sampler=sampler, batch_size=6)
    data = TensorDict(
        {
            "observation": torch.randn(9, 16),
            "action": torch.randn(9, 1),
            "episode": torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2], dtype=torch.long),
            "steps": torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2], dtype=torch.long),
            ("next", "observation"): torch.randn(9, 16),
            ("next", "reward"): torch.randn(9, 1),
            ("next", "done"): torch.tensor([0, 0, 1, 0, 0, 1, 0, 0, 1], dtype=torch.bool).unsqueeze(
                1
            ),
        },
        batch_size=[9],
    )
    assert rb.extend(data).tolist() == list(range(9))  # TorchRL 0.14.1: [0, ..., 8]
    sample, info = rb.sample(return_info=True)
    # TorchRL 0.14.1: 6 steps, 3 slices of 2 consecutive steps of one episode, weights all 1.0
    assert info["priority_weight"].tolist() == [1.0] * 6
    ep, steps = sample["episode"].view(3, 2), sample["steps"].view(3, 2)
    assert (ep[:, 0] == ep[:, 1]).all() and (steps[:, 1] == steps[:, 0] + 1).all()
    rb.update_priority(torch.arange(0, 9, 1), priority=torch.tensor([0, 3, 3, 0, 0, 0, 1, 1, 1]))
    for _ in range(5):
        sample, info = rb.sample(return_info=True)
        weight = info["priority_weight"]
        # TorchRL 0.14.1: 4.5647143451788e-06 for slices of episode 0 (priority 3),
        # 9.12010818865383e-06 for episode 2 (priority 1); episode 1 (priority 0) never drawn
        assert set(sample["episode"].tolist()) <= {0, 2}
        on_ep0 = sample["episode"] == 0
        assert torch.allclose(weight[on_ep0], torch.tensor(4.5647143451788e-06))
        assert torch.allclose(weight[~on_ep0], torch.tensor(9.12010818865383e-06))


def test_slice_sampler_int_episode_example():
    rb = TensorDictReplayBuffer(
        storage=LazyMemmapStorage(1_000_000),
        sampler=SliceSampler(cache_values=True, num_slices=10),
        batch_size=320,
    )
    episode = torch.zeros(1000, dtype=torch.int)
    episode[:300] = 1
    episode[300:550] = 2
    episode[550:700] = 3
    episode[700:] = 4
    data = TensorDict(
        {
            "episode": episode,
            "obs": torch.randn((3, 4, 5)).expand(1000, 3, 4, 5),
            "act": torch.randn((20,)).expand(1000, 20),
            "other": torch.randn((20, 50)).expand(1000, 20, 50),
        },
        [1000],
    )
    rb.extend(data)
    sample = rb.sample()
    # TorchRL 0.14.1: batch [320], episode int32, done/terminated/truncated bool [320, 1],
    # each of the 10 slices of 32 steps within one episode
    assert sample.batch_size == (320,)
    assert sample["episode"].dtype == torch.int32
    for key in ("done", "terminated", "truncated"):
        assert sample["next", key].shape == (320, 1) and sample["next", key].dtype == torch.bool
    assert (sample["episode"].view(10, 32) == sample["episode"].view(10, 32)[:, :1]).all()
    assert set(sample["episode"].unique().tolist()) <= {1, 2, 3, 4}


def test_lazy_stack_storage_example():
    rb = ReplayBuffer(storage=LazyStackStorage(max_size=1000, stack_dim=-1))
    data0 = TensorDict(a=torch.randn((10,)), b=torch.rand(4), c="a string!")
    data1 = TensorDict(a=torch.randn((11,)), b=torch.rand(4), c="another string!")
    rb.add(data0)
    rb.add(data1)
    sample = rb.sample(10)
    # TorchRL 0.14.1: a LazyStackedTensorDict of batch [10], "b" [10, 4] float32
    assert isinstance(sample, LazyStackedTensorDict)
    assert sample.batch_size == (10,)
    assert sample["b"].shape == (10, 4) and sample["b"].dtype == torch.float32


# --------------------------------------------------------------------------------------
# Differences listed in migrating.rst (tdreplay's documented behaviour is pinned)
# --------------------------------------------------------------------------------------


def test_list_storage_of_ints_samples_a_list():
    rb = PrioritizedReplayBuffer(alpha=0.7, beta=0.9, storage=ListStorage(10))
    rb.extend(range(10))
    # TorchRL 0.14.1: TypeError "expected Tensor as element 0 in argument 0, but got int"
    # (migrating.rst: "Sampling a list storage of Python numbers returns a list")
    sample = rb.sample(3)
    assert isinstance(sample, list) and len(sample) == 3
    assert all(isinstance(x, int) and 0 <= x < 10 for x in sample)


def test_two_dim_storage_returns_flat_slots():
    rb = ReplayBuffer(storage=LazyTensorStorage(10, ndim=2), dim_extend=1)
    data = torch.zeros(3, 4)
    # TorchRL 0.14.1: add returns [3, 2] coordinates, extend [12, 2] (migrating.rst: tdreplay
    # returns flat slots shaped like the batch)
    assert rb.add(data[:, 0]).shape == (3,)
    assert rb.extend(data).shape == (3, 4)


# --------------------------------------------------------------------------------------
# Differences not listed in migrating.rst
# --------------------------------------------------------------------------------------


# Found at HEAD 956bb54 (tdreplay set ``index`` in the caller's TensorDict, and migrating.rst
# says TorchRL does too); the uncommitted change to tdreplay-core's replay_buffer.py in the
# working tree at the time of writing makes tdreplay leave it, as TorchRL 0.14.1 does.
@pytest.mark.parametrize("method", ["extend", "add"])
def test_extend_leaves_caller_tensordict_unchanged(method):
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10))
    td = TensorDict({"x": torch.zeros(2)}, [2])
    data = td if method == "extend" else td[0]
    getattr(rb, method)(data)
    # TorchRL 0.14.1: False (its empty Compose().inv hands the buffer a copy)
    assert "index" not in data.keys()


@pytest.mark.parametrize("sampler_cls", [SliceSampler, SliceSamplerWithoutReplacement])
def test_slice_sampler_float_episode_ids(sampler_cls):
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(max_size=1000),
        sampler=sampler_cls(slice_len=5, traj_key="episode", strict_length=False),
    )
    for ep in _float_episode_data():
        rb.extend(ep)
    s = rb.sample(50)
    # TorchRL 0.14.1: a flat batch of whole slices, each within one episode; episode stays float32
    assert s["episode"].dtype == torch.float32
    assert s.batch_size[0] <= 50 and s.batch_size[0] > 0
    assert s["next", "truncated"].dtype == torch.bool


@pytest.mark.parametrize("sampler_cls", [SliceSampler, SliceSamplerWithoutReplacement])
def test_failed_slice_sample_changes_nothing(sampler_cls):
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(max_size=1000),
        sampler=sampler_cls(slice_len=5, traj_key="episode", strict_length=False),
    )
    for ep in _float_episode_data():
        rb.extend(ep)
    first = _outcome(lambda: rb.sample(50))
    second = _outcome(lambda: rb.sample(50))
    # TorchRL 0.14.1: both samples succeed. Whatever the first does, the second must do the same.
    assert first == second


def test_submit_update_if_present_example():
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(4), writer=TensorDictRoundRobinWriter(track_generations=True)
    )
    index = rb.extend(TensorDict({"value": torch.zeros(4)}, batch_size=[4]))
    generation = rb.writer.generations_of(index)
    future = rb.submit_update_if_present(
        index=index, generation=generation, patch={"value": torch.ones(4)}
    )
    # TorchRL 0.14.1: 4
    assert future.result().updated_count == 4
    rb.shutdown()


def test_ensemble_end_streams_example():
    member = TensorDictReplayBuffer(
        storage=LazyTensorStorage(8),
        sampler=SliceSampler(slice_len=2, end_key=("next", "done")),
        writer=TensorDictRoundRobinWriter(track_generations=True),
    )
    member.extend(TensorDict({("next", "done"): torch.zeros(3, 1, dtype=torch.bool)}, [3]))
    replay = ReplayBufferEnsemble(member)
    replay.end_streams()
    # TorchRL 0.14.1: [False, False, True]
    assert member[:]["next", "done"].flatten().tolist() == [False, False, True]


def test_streaming_slice_sampler_example():
    from tdreplay.data import StreamingSliceSampler

    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(16), sampler=StreamingSliceSampler(slice_len=3), batch_size=6
    )
    done = torch.zeros(6, 1, dtype=torch.bool)
    # TorchRL 0.14.1: extend gives [0..5], the sample's values reshaped (2, 3) [[0,1,2],[3,4,5]]
    assert rb.extend(
        TensorDict({"value": torch.arange(6), ("next", "done"): done}, [6])
    ).tolist() == [
        0,
        1,
        2,
        3,
        4,
        5,
    ]
    assert rb.sample()["value"].reshape(2, 3).tolist() == [[0, 1, 2], [3, 4, 5]]


def test_max_value_writer_ranks_the_rows_of_a_two_dim_storage_whole():
    # TorchRL 0.14.1 raises ValueError ("not compatible with storages with more than one
    # dimension"); tdreplay ranks each row of [T] steps by its reduced (summed) rank, as the
    # migrating guide says
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(max_size=6, ndim=2),
        writer=TensorDictMaxValueWriter(rank_key="reward"),
        dim_extend=0,
    )
    reward = torch.tensor([[1.0, 1.0, 1.0], [5.0, 0.0, 0.0], [0.0, 0.0, 0.5], [3.0, 3.0, 3.0]])
    rb.extend(TensorDict({"reward": reward, "row": torch.arange(4)[:, None].expand(4, 3)},
                         [4, 3]))
    assert sorted(rb.storage[:]["row"][:, 0].tolist()) == [1, 3]  # sums 5 and 9 of 3, 5, 0.5, 9


def test_compressed_list_storage_reads_stack_the_items():
    storage = CompressedListStorage(max_size=1000, compression_level=3)
    rb = ReplayBuffer(storage=storage, batch_size=5)
    data = TensorDict({"obs": torch.randn(10, 3, 84, 84)}, batch_size=[10])
    rb.extend(data)
    sample = rb.sample(3)
    # TorchRL 0.14.1: torch.Size([3, 3, 84, 84]) in a LazyStackedTensorDict; rb[:2] a
    # LazyStackedTensorDict; storage[0:2] a list of 2 TensorDicts. tdreplay stacks items of
    # one shape into a TensorDict (the migrating guide says so): the same values and shapes
    assert sample["obs"].shape == (3, 3, 84, 84)
    assert torch.equal(rb[:2]["obs"], data["obs"][:2])
    assert len(storage[0:2]) == 2 and torch.equal(storage[0:2][1]["obs"], data["obs"][1])
