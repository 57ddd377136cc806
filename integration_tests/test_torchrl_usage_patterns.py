"""TorchRL's own replay-buffer usage, run through ``tdreplay.data``.

Each test rebuilds a pattern of TorchRL's sota-implementations (dqn, sac, td3, ppo, dreamer,
...) or tutorials (rb_tutorial, coding_ppo, dqn_with_rnn, multiagent, getting-started,
recurrent_sequence_training) on synthetic data shaped as a collector returns it, and checks
what TorchRL 0.14.1 gives for the same program (observed with TorchRL 0.14.1 and its segment
trees rebuilt for the torch in use; the values are written here as literals, TorchRL is not
imported). Differences listed in docs/guides/migrating.rst (write generations, ``index``
never stored, flat slots instead of coordinates, MultiStep's done flags) are not asserted
either way. The divergences these tests found (``extend`` setting ``index`` in the caller's
TensorDict, nested TensorDicts losing their batch dims in tensor storages) are fixed.
"""

from __future__ import annotations

import functools
import warnings

import pytest
import torch
from tensordict import TensorDict, TensorDictBase, tensorclass
from torch.utils._pytree import tree_map

from tdreplay.data import (
    CatFrames,
    Compose,
    ExcludeTransform,
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
    MultiStep,
    PrioritizedReplayBuffer,
    PrioritizedSampler,
    PrioritizedSliceSampler,
    RandomSampler,
    ReplayBuffer,
    ReplayBufferTrainer,
    RoundRobinWriter,
    SamplerWithoutReplacement,
    SliceSampler,
    TensorDictMaxValueWriter,
    TensorDictPrioritizedReplayBuffer,
    TensorDictReplayBuffer,
    TensorDictRoundRobinWriter,
    ToTensorImage,
    UnsqueezeTransform,
)

#: the leaves of ``collector_data()``, as (key, trailing shape, dtype)
LEAVES = {
    "observation": ((3,), torch.float32),
    "action": ((1,), torch.float32),
    "step_count": ((1,), torch.int64),
    "is_init": ((1,), torch.bool),
    ("collector", "traj_ids"): ((), torch.int64),
    ("next", "observation"): ((3,), torch.float32),
    ("next", "reward"): ((1,), torch.float32),
    ("next", "done"): ((1,), torch.bool),
    ("next", "terminated"): ((1,), torch.bool),
    ("next", "truncated"): ((1,), torch.bool),
}


def collector_data(envs: int = 4, steps: int = 10, ep_len: int = 4, start: int = 0,
                   obs_dim: int = 3) -> TensorDict:
    """``[envs, steps]`` as a collector returns it: step ``t`` of env ``e`` has observation
    ``1000 * e + t`` (``+ 1`` for ``("next", "observation")``), episodes of ``ep_len`` steps
    (done and terminated at their last step, truncated at the batch's last step otherwise)
    and trajectory ids ``100 * e + episode``."""
    t = torch.arange(start, start + steps).expand(envs, steps)
    e = torch.arange(envs)[:, None].expand(envs, steps)
    k = e * 1000 + t
    done = (t + 1) % ep_len == 0
    truncated = torch.zeros(envs, steps, dtype=torch.bool)
    truncated[:, -1] = ~done[:, -1]
    return TensorDict({
        "observation": k[..., None].float().expand(envs, steps, obs_dim).clone(),
        "action": (k % 2)[..., None].float(),
        "step_count": (t % ep_len)[..., None],
        "is_init": (t % ep_len == 0)[..., None],
        ("collector", "traj_ids"): e * 100 + t // ep_len,
        ("next", "observation"): (k + 1)[..., None].float().expand(envs, steps, obs_dim).clone(),
        ("next", "reward"): torch.ones(envs, steps, 1),
        ("next", "done"): (done | truncated)[..., None],
        ("next", "terminated"): done[..., None],
        ("next", "truncated"): truncated[..., None],
    }, [envs, steps])


def leaves(td: TensorDictBase) -> dict:
    """``{key: (shape, dtype)}`` of every leaf (string keys as is, nested ones as tuples)."""
    return {k: (tuple(v.shape), v.dtype) for k, v in td.items(True, True)}


def expected_leaves(batch: tuple[int, ...], *extra: tuple) -> dict:
    """``leaves()`` of a sample of ``collector_data()`` of batch shape ``batch``, plus ``extra``
    ``(key, shape, dtype)`` entries (the sample's info)."""
    out = {k: (batch + shape, dtype) for k, (shape, dtype) in LEAVES.items()}
    out.update({k: (shape, dtype) for k, shape, dtype in extra})
    return out


def slice_starts(sample: TensorDictBase) -> int:
    """Number of slices of a slice sampler's flat sample, asserting each is contiguous.

    A slice continues while the trajectory id stays and the observation goes up by one.
    """
    traj = sample["collector", "traj_ids"]
    obs = sample["observation"][:, 0].long()
    starts = 1
    for i in range(1, len(obs)):
        starts += not (traj[i] == traj[i - 1] and obs[i] == obs[i - 1] + 1)
    return starts


def observations(td: TensorDictBase) -> list[int]:
    return td["observation"][..., 0].long().tolist()


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# --------------------------------------------------------------------------------------------
# rb_tutorial.py


def test_default_buffer_keeps_1000_items():
    rb = ReplayBuffer()
    assert len(rb) == 0
    rb.extend(range(2000))
    # TorchRL 0.14.1: len 1000, a ListStorage
    assert len(rb) == 1000
    assert type(rb.storage).__name__ == "ListStorage"


def test_list_storage_of_python_objects_with_identity_collate():
    rb = ReplayBuffer(storage=ListStorage(100), collate_fn=lambda x: x)
    # TorchRL 0.14.1: indices tensor([0, 1, 2]) (int64); a list of 3 of the items
    assert rb.extend(["a", 0, "b"]).tolist() == [0, 1, 2]
    sample = rb.sample(3)
    assert isinstance(sample, list) and len(sample) == 3
    assert all(item in ["a", 0, "b"] for item in sample)


def test_plain_buffer_sample_of_nested_tensordict():
    rb = ReplayBuffer(storage=LazyTensorStorage(100))
    data = TensorDict({"a": torch.arange(12).view(3, 4), ("b", "c"): torch.arange(15).view(3, 5)}, [3])
    index = rb.extend(data)
    sample = rb.sample(5)
    # TorchRL 0.14.1: index [0, 1, 2] int64, no "index" in a plain ReplayBuffer's sample
    assert index.tolist() == [0, 1, 2] and index.dtype == torch.int64
    assert leaves(sample) == {"a": ((5, 4), torch.int64), ("b", "c"): ((5, 5), torch.int64)}
    assert sorted(data.keys()) == ["a", "b"]


def test_memmap_tensordict_buffer_sample_carries_index(tmp_path):
    data = TensorDict({"a": torch.arange(12).view(3, 4), ("b", "c"): torch.arange(15).view(3, 5)}, [3])
    rb = TensorDictReplayBuffer(storage=LazyMemmapStorage(100, scratch_dir=tmp_path), batch_size=12)
    assert rb.extend(data).tolist() == [0, 1, 2]
    sample = rb.sample()
    # TorchRL 0.14.1: a [12] TensorDict with "index" (int64, [12]) beside the data
    assert leaves(sample) == {"a": ((12, 4), torch.int64), ("b", "c"): ((12, 5), torch.int64),
                              "index": ((12,), torch.int64)}
    assert torch.equal(sample["a"][:, 0], sample["index"] * 4)
    assert any(tmp_path.rglob("*"))


@tensorclass
class MyData:
    images: torch.Tensor
    labels: torch.Tensor


def test_tensorclass_in_plain_buffer():
    data = MyData(images=torch.randint(255, (10, 8, 8, 3)), labels=torch.arange(10), batch_size=[10])
    rb = ReplayBuffer(storage=LazyTensorStorage(100), batch_size=12)
    rb.extend(data)
    sample = rb.sample()
    # TorchRL 0.14.1: a MyData of batch [12], images [12, 8, 8, 3] int64
    assert isinstance(sample, MyData) and sample.shape == (12,)
    assert sample.images.shape == (12, 8, 8, 3) and sample.images.dtype == torch.int64
    assert sample.labels.dtype == torch.int64 and len(rb) == 10


def test_pytree_items_and_a_transform_over_them():
    rb = ReplayBuffer(storage=LazyTensorStorage(100))
    rb.add({"a": torch.randn(3), "b": {"c": (torch.zeros(2), [torch.ones(1)])}, 30: -torch.ones(())})
    sample = rb.sample(10)
    # TorchRL 0.14.1: the same pytree, every leaf stacked on a new leading dim of 10
    assert sample["a"].shape == (10, 3) and sample[30].shape == (10,)
    assert isinstance(sample["b"]["c"], tuple) and isinstance(sample["b"]["c"][1], list)
    assert sample["b"]["c"][0].shape == (10, 2) and sample["b"]["c"][1][0].shape == (10, 1)
    rb.append_transform(lambda x: tree_map(lambda y: y * 0, x))
    sample = rb.sample(batch_size=12)
    assert sample["a"].shape == (12, 3)
    assert all(bool((leaf == 0).all()) for leaf in torch.utils._pytree.tree_leaves(sample))


def test_prefetch_with_a_batch_larger_than_the_buffer():
    data = MyData(images=torch.randint(255, (200, 8, 8, 3)), labels=torch.arange(200), batch_size=[200])
    rb = ReplayBuffer(storage=LazyTensorStorage(100), batch_size=128, prefetch=10)
    rb.extend(data)
    sample = rb.sample()
    # TorchRL 0.14.1: len 100 (the last 100 labels), batches of 128 drawn with replacement
    assert len(rb) == 100 and sample.shape == (128,)
    assert bool((sample.labels >= 100).all())
    shapes = []
    for i, batch in enumerate(rb):
        shapes.append(tuple(batch.shape))
        if i == 3:
            break
    assert shapes == [(128,)] * 4


@pytest.mark.parametrize("storage", [LazyTensorStorage, ListStorage])
def test_iterating_without_replacement_gives_one_epoch(storage):
    rb = TensorDictReplayBuffer(storage=storage(100), batch_size=32, sampler=SamplerWithoutReplacement())
    rb.extend(TensorDict({"a": torch.arange(64).view(16, 4)}, [16]))
    # TorchRL 0.14.1: one batch of the 16 items per pass (drop_last=False)
    for _ in range(2):
        batches = list(rb)
        assert [b.shape for b in batches] == [(16,)]
        assert sorted(batches[0]["a"][:, 0].tolist()) == list(range(0, 64, 4))


def test_without_replacement_sample_sizes_without_batch_size():
    rb = ReplayBuffer(storage=LazyTensorStorage(100), sampler=SamplerWithoutReplacement())
    rb.extend(TensorDict({"a": torch.arange(64).view(16, 4)}, [16]))
    first, second = rb.sample(3), rb.sample(5)
    # TorchRL 0.14.1: [3] then [5], 8 distinct items
    assert first.shape == (3,) and second.shape == (5,)
    assert len(set(first["a"][:, 0].tolist()) | set(second["a"][:, 0].tolist())) == 8


def test_prioritized_list_of_python_objects():
    rb = ReplayBuffer(storage=ListStorage(100), sampler=PrioritizedSampler(max_capacity=100, alpha=0.8, beta=1.1),
                      collate_fn=lambda x: x)
    indices = rb.extend([1, "foo", None])
    rb.update_priority(index=indices, priority=torch.tensor([0, 1_000, 0.1]))
    sample, info = rb.sample(10, return_info=True)
    # TorchRL 0.14.1: indices [0, 1, 2]; a list of 10 items, all "foo"; info "index" (int64,
    # [10]) and "priority_weight" (float32, [10])
    assert indices.tolist() == [0, 1, 2]
    assert sample == ["foo"] * 10
    assert info["index"].dtype == torch.int64 and info["index"].shape == (10,)
    assert info["priority_weight"].dtype == torch.float32 and info["priority_weight"].shape == (10,)


def test_prioritized_tensordict_buffer_over_a_list_storage():
    rb = TensorDictReplayBuffer(storage=ListStorage(100), sampler=PrioritizedSampler(100, alpha=0.8, beta=1.1),
                                priority_key="td_error", batch_size=1024)
    data = TensorDict({"a": torch.arange(64).view(16, 4), "td_error": torch.arange(16)}, [16])
    assert rb.extend(data).tolist() == list(range(16))
    sample = rb.sample()
    # TorchRL 0.14.1: index int64 [1024], priority_weight float32 [1024]; item 0 (priority 0)
    # never drawn, draws growing with the index
    assert leaves(sample)["priority_weight"] == ((1024,), torch.float32)
    assert leaves(sample)["td_error"] == ((1024,), torch.int64)
    counts = torch.bincount(sample["index"], minlength=16)
    assert counts[0] == 0 and counts[8:].sum() > 2 * counts[:8].sum()
    sample = rb.sample()
    sample["td_error"] = 16 - sample["index"]
    rb.update_tensordict_priority(sample)
    counts = torch.bincount(rb.sample()["index"], minlength=16)
    assert counts[:4].sum() > counts[12:].sum()


def pixel_data(n: int = 10) -> TensorDict:
    return TensorDict({"pixels": torch.randint(0, 255, (n, 4, 4, 3), dtype=torch.uint8),
                       ("next", "pixels"): torch.randint(0, 255, (n, 4, 4, 3), dtype=torch.uint8),
                       ("next", "reward"): torch.ones(n, 1),
                       ("next", "done"): torch.zeros(n, 1, dtype=torch.bool),
                       ("collector", "traj_ids"): torch.zeros(n, dtype=torch.int64)}, [n])


def frame_stacking_buffer() -> TensorDictReplayBuffer:
    """rb_tutorial's CatFrames buffer, without its ``Resize`` / ``GrayScale`` (TorchRL's need
    torchvision)."""
    keys = ["pixels_trsf", ("next", "pixels_trsf")]
    transform = Compose(
        ToTensorImage(in_keys=["pixels", ("next", "pixels")], out_keys=keys),
        UnsqueezeTransform(-4, in_keys=keys),
        CatFrames(dim=-4, N=4, in_keys=keys),
    )
    return TensorDictReplayBuffer(storage=LazyTensorStorage(100), transform=transform, batch_size=16)


def test_frame_stacking_transform_on_a_stored_rollout():
    rb = frame_stacking_buffer()
    data = pixel_data()
    rb.add(data)
    sample = rb.sample(1)
    # TorchRL 0.14.1: [1, 10] sample, pixels_trsf float32 [1, 10, 4, 3, 4, 4], the first
    # frames of the stack padded with the first frame
    assert sample.shape == (1, 10)
    assert leaves(sample)["pixels_trsf"] == ((1, 10, 4, 3, 4, 4), torch.float32)
    assert leaves(sample)["index"] == ((1, 10), torch.int64)
    stack = sample["pixels_trsf"][0, 0]
    assert bool((stack[:3] == stack[3:]).all())
    assert torch.equal(sample["pixels"][0], data["pixels"])


def test_rb_tutorial_assertion_after_add():
    # rb_tutorial.py, verbatim but for the transforms:
    #   assert (data.exclude("collector") == s.squeeze(0).exclude("index", "collector")).all()
    # TorchRL 0.14.1: True. tdreplay: KeyError (data has "index", the sample without it not)
    rb = frame_stacking_buffer()
    data = pixel_data()
    rb.add(data)
    s = rb.sample(1).exclude("pixels_trsf", ("next", "pixels_trsf"))
    assert (data.exclude("collector") == s.squeeze(0).exclude("index", "collector")).all()


@pytest.mark.parametrize("op", ["extend", "add"])
@pytest.mark.parametrize("make", [
    lambda: TensorDictReplayBuffer(storage=LazyTensorStorage(10)),
    lambda: TensorDictReplayBuffer(storage=LazyTensorStorage(10), transform=lambda td: td),
    lambda: TensorDictReplayBuffer(storage=ListStorage(10)),
    lambda: TensorDictReplayBuffer(storage=LazyTensorStorage(10), writer=TensorDictRoundRobinWriter()),
    lambda: TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=LazyTensorStorage(10)),
], ids=["tensor", "transform", "list", "td-writer", "prioritized"])
def test_writes_leave_the_callers_tensordict_unchanged(make, op):
    rb = make()
    data = TensorDict({"x": torch.arange(3.0)}, [3])
    if op == "add":
        data = data[0]
    getattr(rb, op)(data)
    # TorchRL 0.14.1: ["x"] for every one of these buffers, after extend and after add
    assert sorted(data.keys()) == ["x"]


def test_slice_sampler_groups_episodes():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), sampler=SliceSampler(traj_key="episode", num_slices=4),
                                batch_size=8)
    episode = torch.tensor([1, 1, 1, 2, 2, 3, 3, 4, 4, 4], dtype=torch.int32)
    steps = torch.tensor([0, 1, 2, 0, 1, 0, 1, 0, 1, 2])
    rb.extend(TensorDict({"episode": episode, "obs": torch.randn(3, 4, 5).expand(10, 3, 4, 5), "steps": steps}, [10]))
    for _ in range(20):
        sample = rb.sample()
        # TorchRL 0.14.1: 4 slices of 2 successive steps of one episode; the slice ends
        # ("next", "done" / "terminated" / "truncated"), bool [8, 1], added to the sample
        ep, st = sample["episode"].view(4, 2), sample["steps"].view(4, 2)
        assert bool((ep[:, 0] == ep[:, 1]).all()) and bool((st[:, 1] == st[:, 0] + 1).all())
    assert sample["episode"].dtype == torch.int32
    for key in ("done", "terminated", "truncated"):
        assert leaves(sample)[("next", key)] == ((8, 1), torch.bool)


# --------------------------------------------------------------------------------------------
# sota-implementations: off-policy buffers (sac, td3, ddpg, cql, iql, crossq, dqn)


def sota_buffer(prb: bool, scratch_dir, prefetch: int = 3, batch_size: int = 32):
    """``make_replay_buffer`` of sac/td3/ddpg's utils.py."""
    storage_cls = (functools.partial(LazyTensorStorage, device="cpu") if not scratch_dir
                   else functools.partial(LazyMemmapStorage, device="cpu", scratch_dir=scratch_dir))
    if prb:
        return TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5, pin_memory=False, prefetch=prefetch,
                                                 storage=storage_cls(1000), batch_size=batch_size)
    return TensorDictReplayBuffer(pin_memory=False, prefetch=prefetch, storage=storage_cls(1000),
                                  batch_size=batch_size)


@pytest.mark.parametrize("memmap", [False, True], ids=["tensor", "memmap"])
@pytest.mark.parametrize("prb", [False, True], ids=["uniform", "prioritized"])
def test_sota_off_policy_buffer(tmp_path, prb, memmap):
    rb = sota_buffer(prb, tmp_path if memmap else None)
    rb.append_transform(lambda td: td.to("cpu"))
    data = collector_data()
    index = rb.extend(data.reshape(-1))
    sample = rb.sample()
    # TorchRL 0.14.1: slots 0..39, len 40, a [32] sample of every entry plus "index" (int64)
    # and, prioritized, "priority_weight" (float32, all 1 before any update)
    assert index.tolist() == list(range(40)) and len(rb) == 40
    extra = [("index", (32,), torch.int64)] + [("priority_weight", (32,), torch.float32)] * prb
    got = leaves(sample)
    got.pop("write_generation", None)  # tdreplay's own (migrating.rst, stale updates)
    assert got == expected_leaves((32,), *extra)
    assert torch.equal(sample["next", "observation"], sample["observation"] + 1)
    assert sorted(map(str, data.keys(True, True))) == sorted(map(str, LEAVES))
    if prb:
        assert bool((sample["priority_weight"] == 1).all())
        with pytest.raises(TypeError):  # the scripts' update_priority(sample): TorchRL too
            rb.update_priority(sample)
        sample["td_error"] = torch.rand(32)
        rb.update_tensordict_priority(sample)
        weight = rb.sample()["priority_weight"]
        assert bool((weight > 0).all()) and bool((weight <= 1 + 1e-6).all())


@pytest.mark.parametrize("shape", [(8,), (8, 1)])
def test_prioritized_update_with_a_column_of_td_errors(shape):
    rb = sota_buffer(True, None, prefetch=0, batch_size=8)
    rb.extend(collector_data().reshape(-1))
    sample = rb.sample()
    sample["td_error"] = torch.rand(shape)
    # TorchRL 0.14.1: accepted for both shapes
    rb.update_tensordict_priority(sample)


def test_prioritized_weights_are_torchrls():
    rb = TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=LazyTensorStorage(100), batch_size=8)
    rb.extend(collector_data().reshape(-1))
    sample = rb.sample()
    # TorchRL 0.14.1: every weight 1.0 before any update
    assert sample["priority_weight"].tolist() == [1.0] * 8
    sample["td_error"] = torch.arange(8.0) + 1
    rb.update_tensordict_priority(sample)
    rb.update_priority(torch.arange(40), torch.ones(40))
    rb.update_priority(torch.tensor([0, 1]), torch.tensor([4.0, 9.0]))
    sample = rb.sample(200)

    def weights_of(s, slot):
        return {round(w, 5) for w in s["priority_weight"][s["index"] == slot].tolist()}

    # TorchRL 0.14.1: slot 0 -> 0.61557, slot 1 -> 0.46346, slot 5 -> 1.0, and a new item gets
    # the max priority (9), so 0.46346
    assert weights_of(sample, 0) == {0.61557}
    assert weights_of(sample, 1) == {0.46346}
    assert weights_of(sample, 5) == {1.0}
    rb.extend(collector_data().reshape(-1)[:2])
    assert weights_of(rb.sample(400), 40) == {0.46346}


def test_priorities_written_with_the_data():
    rb = TensorDictPrioritizedReplayBuffer(alpha=1.0, beta=1.0, storage=LazyTensorStorage(100), batch_size=8)
    data = collector_data().reshape(-1)[:4]
    data["td_error"] = torch.tensor([1.0, 2.0, 3.0, 4.0])
    rb.extend(data)
    sample = rb.sample(2000)
    # TorchRL 0.14.1: draws in proportion 1:2:3:4 (215, 426, 570, 789), item 3 weighted 0.25
    counts = torch.bincount(sample["index"], minlength=4).float() / 2000
    assert torch.allclose(counts, torch.tensor([0.1, 0.2, 0.3, 0.4]), atol=0.04)
    assert {round(w, 4) for w in sample["priority_weight"][sample["index"] == 3].tolist()} == {0.25}


def test_prioritized_buffer_of_plain_tensors():
    rb = PrioritizedReplayBuffer(alpha=0.7, beta=0.9, storage=ListStorage(10), batch_size=5)
    assert rb.extend(torch.arange(10)).tolist() == list(range(10))
    sample, info = rb.sample(return_info=True)
    # TorchRL 0.14.1: an int64 tensor [5]; info with "index" and "priority_weight"
    assert isinstance(sample, torch.Tensor) and sample.shape == (5,) and sample.dtype == torch.int64
    assert {"index", "priority_weight"} <= set(info)
    rb.update_priority(info["index"], torch.ones(5) * 2)


def test_prioritized_slice_sampler_update_and_sample():
    sampler = PrioritizedSliceSampler(max_capacity=100, alpha=0.7, beta=0.9, num_slices=2,
                                      traj_key=("collector", "traj_ids"))
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), sampler=sampler, batch_size=8)
    rb.extend(collector_data().reshape(-1))
    sample = rb.sample()
    sample["td_error"] = torch.rand(8)
    rb.update_tensordict_priority(sample)
    sample = rb.sample()
    # TorchRL 0.14.1: [8], "index" and "priority_weight" added
    assert sample.shape == (8,) and {"index", "priority_weight"} <= set(sample.keys())


def test_prioritized_buffer_over_a_2d_storage():
    rb = TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=LazyTensorStorage(40, ndim=2), batch_size=8)
    rb.extend(collector_data(envs=2, steps=6))
    sample = rb.sample()
    sample["td_error"] = torch.rand(8)
    # TorchRL 0.14.1: len 12, the update accepted (index: [8, 2] coordinates there, flat slots
    # here, migrating.rst)
    rb.update_tensordict_priority(sample)
    assert len(rb) == 12


def test_replay_buffer_trainer_hook_flattens_and_masks():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), batch_size=8)
    hook = ReplayBufferTrainer(rb, flatten_tensordicts=True)
    data = collector_data()
    data["collector", "mask"] = torch.ones(4, 10, dtype=torch.bool)
    data["collector", "mask"][:, -2:] = False
    hook.extend(data)
    sample = hook.sample({})
    # TorchRL 0.14.1: 32 rows kept (the masked ones dropped), a [8] sample with the mask
    assert len(rb) == 32
    assert leaves(sample) == expected_leaves((8,), ("index", (8,), torch.int64),
                                             (("collector", "mask"), (8,), torch.bool))


# --------------------------------------------------------------------------------------------
# on-policy buffers (ppo, a2c, coding_ppo, multiagent_ppo)


@pytest.mark.parametrize("compilable", [False, True])
def test_ppo_epochs_without_replacement(compilable):
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(40, device="cpu", compilable=compilable),
                                sampler=SamplerWithoutReplacement(), batch_size=8, compilable=compilable)
    for iteration in range(2):
        data = collector_data(start=10 * iteration)
        for _ in range(2):
            rb.extend(data.reshape(-1))
            batches = list(rb)
            seen = [o for b in batches for o in observations(b)]
            # TorchRL 0.14.1: 5 batches of 8 per epoch, each of the 40 items once
            assert [b.shape for b in batches] == [(8,)] * 5
            assert sorted(seen) == sorted(observations(data.reshape(-1)))
            assert len(rb) == 40


def test_coding_ppo_sample_loop():
    rb = ReplayBuffer(storage=LazyTensorStorage(max_size=40), sampler=SamplerWithoutReplacement())
    data = collector_data()
    rb.extend(data.reshape(-1))
    seen = [o for _ in range(5) for o in observations(rb.sample(8))]
    rb.extend(data.reshape(-1))
    sample = rb.sample(8)
    # TorchRL 0.14.1: 40 distinct items in 5 draws of 8; a plain buffer's sample has no "index"
    assert len(set(seen)) == 40 and len(rb) == 40
    assert sorted(sample.keys()) == ["action", "collector", "is_init", "next", "observation", "step_count"]


def test_multiagent_ppo_buffer():
    rb = ReplayBuffer(storage=LazyTensorStorage(40, device="cpu"), sampler=SamplerWithoutReplacement(), batch_size=8)
    data = collector_data().reshape(-1)
    data["agents"] = TensorDict({"observation": torch.randn(40, 3, 5), "action": torch.randn(40, 3, 2)}, [40, 3])
    rb.extend(data)
    samples = [rb.sample() for _ in range(5)]
    # TorchRL 0.14.1: 40 distinct items; agents' entries [8, 3, ...]
    assert len({o for s in samples for o in observations(s)}) == 40
    assert samples[0]["agents", "action"].shape == (8, 3, 2)


@pytest.mark.parametrize("read", ["sample", "rb[:]", "rb[0]", "storage[:]"])
@pytest.mark.parametrize("storage", [LazyTensorStorage, LazyMemmapStorage])
def test_nested_agent_batch_dims_survive_storage(tmp_path, storage, read):
    kwargs = {"scratch_dir": tmp_path} if storage is LazyMemmapStorage else {}
    rb = TensorDictReplayBuffer(storage=storage(40, **kwargs), batch_size=8)
    data = collector_data().reshape(-1)
    data["agents"] = TensorDict({"observation": torch.randn(40, 3, 5)}, [40, 3])
    rb.extend(data)
    got = {"sample": lambda: rb.sample(), "rb[:]": lambda: rb[:], "rb[0]": lambda: rb[0],
           "storage[:]": lambda: rb.storage[:]}[read]()
    # TorchRL 0.14.1: agents' batch [8, 3] / [40, 3] / [3] / [40, 3]; tdreplay: [8] / [40] / [] / [40]
    expected = {"sample": (8, 3), "rb[:]": (40, 3), "rb[0]": (3,), "storage[:]": (40, 3)}[read]
    assert got["agents"].batch_size == expected


@pytest.mark.parametrize(("drop_last", "epoch", "samples"), [
    (False, [(16,), (16,), (8,)], [16, 16, 8, 16]),
    (True, [(16,), (16,)], [16, 16, 16, 16]),
])
def test_without_replacement_epoch_ends(drop_last, epoch, samples):
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(50), sampler=SamplerWithoutReplacement(drop_last=drop_last),
                                batch_size=16)
    rb.extend(collector_data().reshape(-1))
    # TorchRL 0.14.1: the epochs and sample sizes listed (40 items, batches of 16)
    assert [b.shape for b in rb] == epoch
    assert [b.shape for b in rb] == epoch
    assert [rb.sample().shape[0] for _ in range(4)] == samples


# --------------------------------------------------------------------------------------------
# slices: dreamer, dreamer_v3, dqn_with_rnn, recurrent_sequence_training, CatFrames


def test_dreamer_buffer_ndim2_memmap_slices(tmp_path):
    storage = LazyMemmapStorage(200, scratch_dir=tmp_path, device="cpu", ndim=2, shared_init=True)
    sampler = SliceSampler(slice_len=5, strict_length=False, traj_key=("collector", "traj_ids"),
                           cache_values=False, use_gpu=False)
    rb = TensorDictReplayBuffer(prefetch=2, storage=storage, sampler=sampler, batch_size=20,
                                transform=Compose(functools.partial(lambda td, device: td.to(device), device="cpu")))
    for i in range(3):
        rb.extend(collector_data(envs=4, steps=10, ep_len=7, start=10 * i))
    # TorchRL 0.14.1: len 120, rb[:] [4, 30], storage rows are time steps; samples flat, at
    # most 20 steps in at most 4 contiguous slices, some shorter (strict_length=False)
    assert len(rb) == 120 and rb[:].shape == (4, 30)
    assert observations(rb.storage[:][:6, 0]) == [0, 1, 2, 3, 4, 5]
    sizes = []
    for _ in range(20):
        sample = rb.sample()
        assert sample.ndim == 1 and slice_starts(sample) <= 4
        sizes.append(sample.shape[0])
    assert max(sizes) <= 20 and min(sizes) < 20
    assert set(leaves(sample)) == set(LEAVES) | {"index"}


def test_ndim2_storage_wraps_along_time():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(40, ndim=2), batch_size=8,
                                sampler=SliceSampler(slice_len=4, strict_length=False, traj_key=("collector", "traj_ids")))
    for i in range(3):
        rb.extend(collector_data(envs=4, steps=6, ep_len=5, start=6 * i))
    # TorchRL 0.14.1: len 40, rb[:] [4, 10], env 0's rows [10..17, 8, 9] after the wrap
    assert len(rb) == 40 and rb[:].shape == (4, 10)
    assert observations(rb.storage[:][:, 0]) == [10, 11, 12, 13, 14, 15, 16, 17, 8, 9]
    assert all(slice_starts(rb.sample()) <= 2 for _ in range(20))


def test_ndim2_storage_layout():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(20, ndim=2), batch_size=6)
    rb.extend(collector_data(envs=2, steps=4))
    sample = rb.sample()
    # TorchRL 0.14.1: len 8, rb[:] [2, 4], storage rows [[0, 1000], [1, 1001], ...]; flat
    # [6] samples
    assert len(rb) == 8 and rb[:].shape == (2, 4)
    assert observations(rb.storage[:]) == [[0, 1000], [1, 1001], [2, 1002], [3, 1003]]
    got = leaves(sample)
    got.pop("index")  # [6, 2] coordinates in TorchRL, flat slots here (migrating.rst)
    assert got == expected_leaves((6,))


def test_short_trajectories_with_strict_length_false():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(200, ndim=2), batch_size=20,
                                sampler=SliceSampler(slice_len=5, strict_length=False, traj_key=("collector", "traj_ids")))
    rb.extend(collector_data(envs=2, steps=12, ep_len=3))
    # TorchRL 0.14.1: flat samples of at most 20 steps
    for _ in range(10):
        sample = rb.sample()
        assert sample.ndim == 1 and sample.shape[0] <= 20
    assert set(leaves(sample)) == set(LEAVES) | {"index"}


def test_dreamer_v3_plain_buffer_slices():
    rb = ReplayBuffer(storage=LazyTensorStorage(max_size=200), batch_size=20,
                      sampler=SliceSampler(slice_len=5, traj_key=("collector", "traj_ids")))
    rb.extend(collector_data(envs=4, steps=10, ep_len=10).reshape(-1))
    sample = rb.sample()
    obs = sample["observation"][:, 0].long().view(4, 5)
    # TorchRL 0.14.1: 4 contiguous slices of 5; no "index" in a plain buffer's sample
    assert bool((obs[:, 1:] - obs[:, :-1] == 1).all())
    assert set(leaves(sample)) == set(LEAVES)


def test_dqn_with_rnn_buffer(tmp_path):
    sampler = SliceSampler(slice_len=5, end_key=("next", "done"), cache_values=True, strict_length=False)
    rb = TensorDictReplayBuffer(storage=LazyMemmapStorage(1000, scratch_dir=tmp_path), sampler=sampler,
                                batch_size=20, prefetch=3, transform=lambda td: td.to("cpu"))
    rb.extend(collector_data(envs=4, steps=10, ep_len=7).reshape(-1))
    sample = rb.sample()
    # TorchRL 0.14.1: a flat sample of 16 (here: a trajectory ends at every done or truncation)
    assert sample.ndim == 1 and sample.shape[0] <= 20
    assert set(leaves(sample)) == set(LEAVES) | {"index"}


def test_recurrent_slices_mark_is_init():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(max_size=1024), batch_size=16,
                                sampler=SliceSampler(slice_len=4, strict_length=False))
    data = collector_data(envs=1, steps=40, ep_len=10).reshape(-1)
    data["episode"] = data["collector", "traj_ids"]
    del data["collector"]
    rb.extend(data)
    sample = rb.sample()
    starts = sample["is_init"].squeeze(-1).nonzero().squeeze(-1).tolist()
    # TorchRL 0.14.1: [16], is_init at every slice start (0, 4, 8, 12); "episode" detected
    assert sample.shape == (16,) and {0, 4, 8, 12} <= set(starts)
    assert rb.sampler.traj_key == "episode"


def test_slice_sample_info():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), batch_size=8,
                                sampler=SliceSampler(num_slices=2, traj_key=("collector", "traj_ids")))
    rb.extend(collector_data().reshape(-1))
    sample, info = rb.sample(return_info=True)
    # TorchRL 0.14.1: info keys index, is_init and the slice ends ([8, 1] bool); every slice's
    # last step truncated and done
    assert set(info) == {"index", "is_init", ("next", "done"), ("next", "terminated"), ("next", "truncated")}
    for key in ("is_init", ("next", "done"), ("next", "terminated"), ("next", "truncated")):
        assert info[key].shape == (8, 1) and info[key].dtype == torch.bool
    sample = rb.sample()
    assert bool(sample["next", "truncated"].view(2, 4)[:, -1].all())
    assert bool(sample["next", "done"].view(2, 4)[:, -1].all())


def test_catframes_rb_transform_and_sampler():
    catframes = CatFrames(N=4, dim=-2, in_keys=["obs_stack"], out_keys=["obs_stack"])
    transform, sampler = catframes.make_rb_transform_and_sampler(batch_size=12, traj_key=("collector", "traj_ids"),
                                                                  strict_length=True)
    keys = ["obs_stack", ("next", "obs_stack")]
    rb = ReplayBuffer(storage=LazyTensorStorage(200), sampler=sampler, batch_size=12,
                      transform=Compose(UnsqueezeTransform(dim=-2, in_keys=["observation", ("next", "observation")],
                                                           out_keys=keys), transform))
    rb.extend(collector_data(envs=2, steps=20, ep_len=10, obs_dim=1).reshape(-1))
    sample = rb.sample()
    stack = sample["obs_stack"][..., 0]
    # TorchRL 0.14.1: 12 stacks of 4 successive frames ending at the step's observation, the
    # next stack one step ahead; obs_stack float32 [12, 4, 1]
    assert sample.shape == (12,)
    assert leaves(sample)["obs_stack"] == ((12, 4, 1), torch.float32)
    assert bool((stack[:, 1:] - stack[:, :-1] == 1).all())
    assert torch.equal(stack[:, -1], sample["observation"][:, 0])
    assert torch.equal(sample["next", "obs_stack"], sample["obs_stack"] + 1)


# --------------------------------------------------------------------------------------------
# transforms, writers, storages, checkpoints


def test_multistep_rewards_and_steps():
    out = MultiStep(gamma=0.9, n_steps=3)(collector_data(envs=2, steps=6, ep_len=4))
    # TorchRL 0.14.1 (torchrl.data.MultiStep): per env, reward [2.71, 2.71, 1.9, 1, 1.9, 1],
    # steps_to_next_obs [3, 3, 2, 1, 2, 1], gamma 0.9 ** steps, original_reward kept.
    # gamma / steps_to_next_obs are [2, 6] in both; the done flags differ (migrating.rst)
    reward = torch.tensor([2.71, 2.71, 1.9, 1.0, 1.9, 1.0])
    steps = torch.tensor([3, 3, 2, 1, 2, 1])
    assert out["gamma"].shape == out["steps_to_next_obs"].shape == (2, 6)
    assert torch.allclose(out["next", "reward"].view(2, 6), reward.expand(2, 6))
    assert torch.equal(out["steps_to_next_obs"].reshape(2, 6), steps.expand(2, 6))
    assert torch.allclose(out["gamma"].reshape(2, 6), (0.9 ** steps.float()).expand(2, 6))
    assert torch.equal(out["next", "original_reward"], torch.ones(2, 6, 1))


def test_exclude_transform_in_buffer():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), batch_size=4)
    rb.append_transform(ExcludeTransform("step_count", ("next", "truncated"), "collector"))
    rb.extend(collector_data().reshape(-1))
    # TorchRL 0.14.1: the excluded entries are stored (rb.storage[:]) but absent from samples
    # and from rb[:]
    kept = set(LEAVES) - {"step_count", ("next", "truncated"), ("collector", "traj_ids")}
    assert set(leaves(rb.sample())) == kept | {"index"}
    assert set(leaves(rb[:])) == kept
    assert set(leaves(rb.storage[:])) == set(LEAVES)


def test_round_robin_writer_wraps():
    rb = ReplayBuffer(storage=LazyTensorStorage(10), writer=RoundRobinWriter(), batch_size=4)
    # TorchRL 0.14.1: slots [0..6] then [7, 8, 9, 0, 1, 2, 3]; storage [10..13, 4..9]
    assert rb.extend(torch.arange(7)).tolist() == [0, 1, 2, 3, 4, 5, 6]
    assert rb.extend(torch.arange(7, 14)).tolist() == [7, 8, 9, 0, 1, 2, 3]
    assert rb[:].tolist() == [10, 11, 12, 13, 4, 5, 6, 7, 8, 9]
    assert len(rb) == 10 and rb.write_count == 14


def test_overflowing_extend_and_storage_order():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(25), batch_size=4)
    index = rb.extend(collector_data().reshape(-1))
    # TorchRL 0.14.1: slots 0..24 then 0..14, len 25, write_count 40, rows in storage order
    assert index.tolist() == list(range(25)) + list(range(15))
    assert len(rb) == 25 and rb.write_count == 40
    assert rb[:]["observation"][:, 0].long().tolist() == [
        2005, 2006, 2007, 2008, 2009, 3000, 3001, 3002, 3003, 3004, 3005, 3006, 3007, 3008, 3009,
        1005, 1006, 1007, 1008, 1009, 2000, 2001, 2002, 2003, 2004]
    small = ReplayBuffer(storage=LazyTensorStorage(5))
    small.extend(torch.arange(8))
    # TorchRL 0.14.1: [5, 6, 7, 3, 4], rb[-1] == 4 (storage order, not write order)
    assert small[:].tolist() == [5, 6, 7, 3, 4] and int(small[-1]) == 4


@pytest.mark.parametrize(("rank_key", "values", "capacity", "kept"), [
    ("key", [[1.0, 5, 3, 9], [2.0, 7, 4, 8], 0.5, 10.0], 5, [5.0, 7.0, 8.0, 9.0, 10.0]),
    (("next", "reward"), [[1.0, 5, 3, 9, 2]], 3, [3.0, 5.0, 9.0]),
])
def test_max_value_writer_keeps_the_best(rank_key, values, capacity, kept):
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(capacity), writer=TensorDictMaxValueWriter(rank_key=rank_key),
                                batch_size=2)
    trailing = (1,) if isinstance(rank_key, tuple) else ()  # collectors' [B, 1] rewards
    for value in values:
        value = torch.tensor(value)
        batch = TensorDict({rank_key: value.reshape(value.shape + trailing), "obs": torch.zeros(value.shape)},
                           value.shape)
        rb.extend(batch) if value.ndim else rb.add(batch)
    # TorchRL 0.14.1: the best `capacity` ranks kept
    assert sorted(rb[:][rank_key].flatten().tolist()) == kept


def test_uniform_sample_info():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), batch_size=4)
    rb.extend(collector_data().reshape(-1))
    _, info = rb.sample(return_info=True)
    # TorchRL 0.14.1: info {"index"}; a sample adds only "index" (int64)
    assert set(info) == {"index"}
    assert leaves(rb.sample()) == expected_leaves((4,), ("index", (4,), torch.int64))


def test_list_storage_of_tensordicts_collates():
    rb = TensorDictReplayBuffer(storage=ListStorage(100), batch_size=4)
    rb.extend(collector_data().reshape(-1))
    # TorchRL 0.14.1: a stacked [4] TensorDict with "index"
    assert leaves(rb.sample()) == expected_leaves((4,), ("index", (4,), torch.int64))


def test_indexing_a_buffer():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), batch_size=4)
    rb.extend(collector_data().reshape(-1))
    # TorchRL 0.14.1: rb[0] [], rb[2:5] [3], rb[tensor([1, 2])] [2], rb[-1] observation 3009
    assert rb[0].shape == () and rb[2:5].shape == (3,) and rb[torch.tensor([1, 2])].shape == (2,)
    assert int(rb[-1]["observation"][0]) == 3009


def test_batch_of_trajectories_in_a_flat_storage():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10), batch_size=3)
    # TorchRL 0.14.1 (coding_ddpg stores [envs, T] batches so): 4 items of [6] each
    assert rb.extend(collector_data(envs=4, steps=6)).tolist() == [0, 1, 2, 3]
    assert len(rb) == 4 and rb[:].shape == (4, 6) and rb.sample().shape == (3, 6)
    assert rb[:]["observation"][:, 0, 0].tolist() == [0.0, 1000.0, 2000.0, 3000.0]


def test_sample_size_overrides_batch_size():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(50), batch_size=16)
    rb.extend(collector_data().reshape(-1))
    # TorchRL 0.14.1: [4] (and a UserWarning, which tdreplay does not give)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert rb.sample(4).shape == (4,)


def test_empty_resets_length_and_write_count():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(50), batch_size=4)
    rb.extend(collector_data().reshape(-1))
    assert rb.write_count == 40
    rb.empty()
    # TorchRL 0.14.1: len 0, write_count 0; then 5 and 5
    assert len(rb) == 0 and rb.write_count == 0
    rb.extend(collector_data().reshape(-1)[:5])
    assert len(rb) == 5 and rb.write_count == 5


def test_sampling_an_empty_buffer_raises():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), batch_size=4)
    # TorchRL 0.14.1: RuntimeError
    with pytest.raises(RuntimeError):
        rb.sample()


def test_state_dict_round_trip():
    def make():
        return TensorDictReplayBuffer(storage=LazyTensorStorage(30), sampler=SamplerWithoutReplacement(), batch_size=8)

    rb = make()
    rb.extend(collector_data().reshape(-1))
    restored = make()
    restored.load_state_dict(rb.state_dict())
    # TorchRL 0.14.1: len 30, same rows, writer cursor 10
    assert len(restored) == 30 and bool((restored[:] == rb[:]).all())
    assert restored.writer.cursor == 10


def test_dumps_loads_prioritized(tmp_path):
    def make(scratch):
        return TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5, batch_size=8,
                                                 storage=LazyMemmapStorage(100, scratch_dir=scratch))

    rb = make(tmp_path / "a")
    rb.extend(collector_data().reshape(-1))
    sample = rb.sample()
    sample["td_error"] = torch.rand(8)
    rb.update_tensordict_priority(sample)
    rb.dumps(tmp_path / "ckpt")
    restored = make(tmp_path / "b")
    restored.loads(tmp_path / "ckpt")
    # TorchRL 0.14.1: len 40, same rows, write_count 40, samples of [8]
    assert len(restored) == 40 and bool((restored[:] == rb[:]).all())
    assert restored.write_count == 40 and restored.sample().shape == (8,)


def test_dumps_loads_ndim2_slices(tmp_path):
    def make(scratch):
        sampler = SliceSampler(slice_len=4, traj_key=("collector", "traj_ids"), strict_length=False)
        return TensorDictReplayBuffer(storage=LazyMemmapStorage(80, ndim=2, scratch_dir=scratch), sampler=sampler,
                                      batch_size=8)

    rb = make(tmp_path / "a")
    rb.extend(collector_data(envs=4, steps=10, ep_len=6))
    rb.dumps(tmp_path / "ckpt")
    restored = make(tmp_path / "b")
    restored.loads(tmp_path / "ckpt")
    assert all(slice_starts(restored.sample()) <= 2 for _ in range(10))
    restored.extend(collector_data(envs=4, steps=10, ep_len=6, start=10))
    # TorchRL 0.14.1: len 80, [4, 20], the first 10 steps those saved
    assert len(restored) == 80 and restored[:].shape == (4, 20)
    assert bool((restored[:][:, :10] == rb[:]).all())


def test_getting_started_memmap_buffer(tmp_path):
    rb = ReplayBuffer(storage=LazyMemmapStorage(max_size=1000, scratch_dir=tmp_path))
    # TorchRL 0.14.1: indices 0..39, len 40, max step_count 3, rb[:] of every entry
    assert rb.extend(collector_data().reshape(-1)).tolist() == list(range(40))
    assert len(rb) == 40 and int(rb[:]["step_count"].max()) == 3
    assert leaves(rb[:]) == expected_leaves((40,))


def test_multiagent_ddpg_memmap_buffer(tmp_path):
    rb = ReplayBuffer(storage=LazyMemmapStorage(100, scratch_dir=tmp_path), sampler=RandomSampler(), batch_size=16)
    rb.extend(TensorDict({"agent": TensorDict({"obs": torch.randn(40, 2, 3)}, [40, 2]),
                          ("next", "reward"): torch.randn(40, 1)}, [40]))
    sample = rb.sample()
    # TorchRL 0.14.1: len 40, agent obs [16, 2, 3], reward [16, 1]
    assert len(rb) == 40
    assert leaves(sample) == {("agent", "obs"): ((16, 2, 3), torch.float32),
                              ("next", "reward"): ((16, 1), torch.float32)}
