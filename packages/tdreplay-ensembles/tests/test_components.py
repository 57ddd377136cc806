"""StorageEnsemble, SamplerEnsemble and WriterEnsemble on their own."""

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import (
    CheckpointError,
    Compose,
    ListStorage,
    RandomSampler,
    RoundRobinWriter,
    TensorDictReplayBuffer,
)
from tdreplay.ensembles import (
    ReplayBufferEnsemble,
    SampleFromAllConflictError,
    SamplerEnsemble,
    StorageEnsemble,
    StorageEnsembleCheckpointer,
    WriterEnsemble,
    stack_parts,
)
from tdreplay.storages import LazyTensorStorage


def _filled_storages(*sizes, capacity=10):
    storages = []
    for buffer_id, size in enumerate(sizes):
        storage = LazyTensorStorage(capacity)
        if size:
            storage.set(slice(0, size), TensorDict(
                obs=buffer_id * 100 + torch.arange(size, dtype=torch.float32),
                batch_size=[size]))
        storages.append(storage)
    return StorageEnsemble(*storages)


# ---- StorageEnsemble ---------------------------------------------------------------------------


def test_storage_ensemble_get_reads_each_part_from_its_storage():
    storages = _filled_storages(4, 6)
    index = TensorDict(index=torch.tensor([[3, 1], [5, 0]]), buffer_ids=torch.tensor([0, 1]),
                       batch_size=[2])
    parts = storages.get(index)
    assert [buffer_id for buffer_id, _ in parts] == [0, 1]
    assert parts[0][1]["obs"].tolist() == [3.0, 1.0]
    assert parts[1][1]["obs"].tolist() == [105.0, 100.0]


def test_storage_ensemble_get_accepts_expanded_buffer_ids_and_lists():
    storages = _filled_storages(4, 6)
    part = TensorDict(index=torch.tensor([2, 2]), buffer_ids=torch.tensor([1, 1]), batch_size=[2])
    (buffer_id, data), = storages.get([part])
    assert buffer_id == 1 and data["obs"].tolist() == [102.0, 102.0]


def test_storage_ensemble_get_refuses_mixed_parts_and_bad_ids():
    storages = _filled_storages(4, 6)
    mixed = TensorDict(index=torch.tensor([[0, 1]]), buffer_ids=torch.tensor([[0, 1]]),
                       batch_size=[1, 2])
    with pytest.raises(ValueError, match="one buffer"):
        storages.get(mixed)
    out_of_range = TensorDict(index=torch.tensor([[0]]), buffer_ids=torch.tensor([2]),
                              batch_size=[1])
    with pytest.raises(IndexError, match="out of range for 2 storages"):
        storages.get(out_of_range)
    with pytest.raises(TypeError, match="'index' and 'buffer_ids'"):
        storages.get(torch.tensor([0, 1]))


def test_storage_ensemble_refuses_writes():
    storages = _filled_storages(2, 2)
    with pytest.raises(RuntimeError, match="cannot be written"):
        storages.set(0, TensorDict(obs=torch.zeros(()), batch_size=[]))
    with pytest.raises(RuntimeError, match="cannot be written"):
        storages[0:1] = TensorDict(obs=torch.zeros(1), batch_size=[1])
    assert [len(s) for s in storages.storages] == [2, 2]


def test_storage_ensemble_indexing():
    s0, s1, s2 = ListStorage(3), ListStorage(4), ListStorage(5)
    t0 = Compose(lambda x: x)
    storages = StorageEnsemble(s0, s1, s2, transforms=[t0, None, lambda x: x])
    assert storages[0] is s0 and storages[-1] is s2 and storages[torch.tensor(1)] is s1
    sub = storages[1:]
    assert isinstance(sub, StorageEnsemble) and sub.storages == (s1, s2)
    assert sub.transforms[0] is None and isinstance(sub.transforms[1], Compose)
    assert storages[[2, 0]].storages == (s2, s0) and storages[[2, 0]].transforms[1] is t0
    assert storages[torch.tensor([0, 2])].storages == (s0, s2)
    s1.set(torch.arange(2), ["a", "b"])
    assert storages[1, 1] == "b" and storages[1, 0:2] == ["a", "b"]
    assert len(storages) == 3 and storages.max_size == 12
    with pytest.raises(IndexError, match="out of range for 3 storages"):
        storages[3]
    with pytest.raises(TypeError, match="integer"):
        storages[torch.tensor([0.5])]
    with pytest.raises(TypeError, match="bool"):
        storages[True]


def test_storage_ensemble_bad_construction():
    with pytest.raises(ValueError, match="at least one storage"):
        StorageEnsemble()
    with pytest.raises(TypeError, match=r"storages\[1\] must be a Storage"):
        StorageEnsemble(ListStorage(2), [1, 2])
    with pytest.raises(ValueError, match=r"transforms must have one entry per storage \(2\), got 1"):
        StorageEnsemble(ListStorage(2), ListStorage(2), transforms=[None])
    with pytest.raises(TypeError, match=r"transforms\[0\]"):
        StorageEnsemble(ListStorage(2), transforms=[3])
    with pytest.raises(TypeError, match="do not nest"):
        StorageEnsemble(StorageEnsemble(ListStorage(2)))


def test_storage_ensemble_state_dict_round_trip_and_rollback():
    storages = _filled_storages(3, 5)
    state = storages.state_dict()
    assert set(state) == {"0", "1"}
    fresh = _filled_storages(0, 1)
    fresh.load_state_dict(state)
    assert [len(s) for s in fresh.storages] == [3, 5]
    assert fresh[1].get(torch.tensor([4]))["obs"].tolist() == [104.0]
    with pytest.raises(ValueError, match="keys"):
        fresh.load_state_dict({"0": state["0"]})
    # member 1 refuses its state (capacity too small): member 0, already loaded, is rolled back
    small = StorageEnsemble(LazyTensorStorage(10), LazyTensorStorage(2))
    small[0].set(slice(0, 1), TensorDict(obs=torch.tensor([7.0]), batch_size=[1]))
    with pytest.raises((ValueError, RuntimeError)):
        small.load_state_dict(state)
    assert len(small[0]) == 1 and small[0].get(torch.tensor([0]))["obs"].tolist() == [7.0]
    assert len(small[1]) == 0


def test_storage_ensemble_checkpoint_round_trip(tmp_path):
    storages = _filled_storages(3, 5)
    assert isinstance(storages.checkpointer, StorageEnsembleCheckpointer)
    storages.dumps(tmp_path / "ckpt")
    restored = _filled_storages(0, 0)
    restored.loads(tmp_path / "ckpt")
    assert [len(s) for s in restored.storages] == [3, 5]
    assert restored[0].get(torch.arange(3))["obs"].tolist() == [0.0, 1.0, 2.0]
    assert restored[1].get(torch.arange(5))["obs"].tolist() == [100.0 + i for i in range(5)]


def test_storage_ensemble_checkpoint_mismatch_changes_nothing(tmp_path):
    _filled_storages(3, 5).dumps(tmp_path / "ckpt")
    three = StorageEnsemble(LazyTensorStorage(10), LazyTensorStorage(10), LazyTensorStorage(10))
    with pytest.raises(CheckpointError, match="2 members but this StorageEnsemble has 3"):
        three.loads(tmp_path / "ckpt")
    other_kind = StorageEnsemble(LazyTensorStorage(10), ListStorage(10))
    with pytest.raises(CheckpointError, match="member 1 is a LazyTensorStorage"):
        other_kind.loads(tmp_path / "ckpt")
    # member 1 has another capacity: its checkpointer refuses before member 0 changes
    target = _filled_storages(1, 1, capacity=10)
    target = StorageEnsemble(target[0], LazyTensorStorage(7))
    with pytest.raises(CheckpointError, match="max_size"):
        target.loads(tmp_path / "ckpt")
    assert len(target[0]) == 1 and len(target[1]) == 0


def test_storage_ensemble_hooks_reach_every_storage(tmp_path):
    storages = StorageEnsemble(ListStorage(5), ListStorage(5))
    storages[0].set(torch.arange(2), [1, 2])
    storages[1].set(torch.arange(1), [3])
    storages.register_save_hook(lambda items: [x * 10 for x in items])
    storages.dumps(tmp_path)
    restored = StorageEnsemble(ListStorage(5), ListStorage(5))
    restored.register_load_hook(lambda items: [x + 1 for x in items])
    restored.loads(tmp_path)
    assert restored[0][:] == [11, 21] and restored[1][:] == [31]


# ---- SamplerEnsemble ---------------------------------------------------------------------------


def test_sampler_ensemble_sample_from_all_covers_every_buffer_in_order():
    storages = _filled_storages(4, 6, 2)
    sampler = SamplerEnsemble(RandomSampler(), RandomSampler(), RandomSampler(),
                              sample_from_all=True)
    index, info = sampler.sample(storages, 9)
    assert index.batch_size == torch.Size([3, 3]) and info == {}
    assert index["buffer_ids"].tolist() == [[0] * 3, [1] * 3, [2] * 3]
    assert index["index"].dtype == torch.long
    for buffer_id, size in enumerate((4, 6, 2)):
        assert bool(((index["index"][buffer_id] >= 0) & (index["index"][buffer_id] < size)).all())


def test_sampler_ensemble_p_weights_the_draw_with_replacement():
    storages = _filled_storages(3, 3)
    sampler = SamplerEnsemble(RandomSampler(), RandomSampler(), p=[3.0, 1.0])
    sampler.set_rng(torch.Generator().manual_seed(0))
    counts = torch.zeros(2)
    same_buffer_twice = 0
    for _ in range(400):
        index, _ = sampler.sample(storages, 4)
        ids = index["buffer_ids"][:, 0]
        counts += torch.bincount(ids, minlength=2)
        same_buffer_twice += int(ids[0] == ids[1])
    share = counts[0] / counts.sum()
    assert 0.70 < float(share) < 0.80  # p normalised to [0.75, 0.25]
    assert same_buffer_twice > 0  # drawn with replacement, as in TorchRL
    torch.testing.assert_close(sampler.p, torch.tensor([0.75, 0.25], dtype=torch.float64))


def test_sampler_ensemble_zero_weight_buffer_is_never_drawn_and_may_be_empty():
    storages = _filled_storages(3, 0, 3)
    sampler = SamplerEnsemble(RandomSampler(), RandomSampler(), RandomSampler(), p=[1, 0, 1],
                              num_buffer_sampled=2)
    for _ in range(50):
        index, _ = sampler.sample(storages, 4)
        assert 1 not in index["buffer_ids"].unique().tolist()


def test_sampler_ensemble_uniform_draw_without_p():
    storages = _filled_storages(3, 3, 3)
    sampler = SamplerEnsemble(RandomSampler(), RandomSampler(), RandomSampler(),
                              num_buffer_sampled=1)
    sampler.set_rng(torch.Generator().manual_seed(1))
    seen = torch.zeros(3)
    for _ in range(300):
        index, _ = sampler.sample(storages, 2)
        assert index.batch_size == torch.Size([1, 2])
        seen[int(index["buffer_ids"][0, 0])] += 1
    assert bool((seen > 70).all())


def test_sampler_ensemble_generator_makes_draws_reproducible():
    storages = _filled_storages(5, 5)

    def draws(seed):
        sampler = SamplerEnsemble(RandomSampler(), RandomSampler(), p=[0.5, 0.5])
        sampler.set_rng(torch.Generator().manual_seed(seed))
        return [sampler.sample(storages, 4)[0] for _ in range(5)]

    for a, b in zip(draws(3), draws(3)):
        assert torch.equal(a["index"], b["index"]) and torch.equal(a["buffer_ids"], b["buffer_ids"])


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"p": [1.0]}, ValueError, r"p must hold one weight per buffer \(2\), got 1"),
        ({"p": [1.0, 2.0, 3.0]}, ValueError, r"p must hold one weight per buffer \(2\), got 3"),
        ({"p": [[0.5, 0.5]]}, ValueError, "p must hold one weight per buffer"),
        ({"p": [-1.0, 2.0]}, ValueError, "p must hold non-negative weights"),
        ({"p": [0.0, 0.0]}, ValueError, "p must give at least one buffer a positive weight"),
        ({"p": [float("nan"), 1.0]}, ValueError, "p must hold finite weights"),
        ({"p": "ab"}, ValueError, "p must be a sequence .* or .sampleable.* got .ab."),
        ({"p": ["a", "b"]}, TypeError, "p must hold numbers"),
        ({"p": torch.tensor([True, False])}, TypeError, "p must hold real numbers"),
        ({"p": [0.5, 0.5], "sample_from_all": True}, ValueError, "p and sample_from_all"),
        ({"num_buffer_sampled": 0}, ValueError, "num_buffer_sampled must be a positive int"),
        ({"num_buffer_sampled": -2}, ValueError, "num_buffer_sampled must be a positive int"),
        ({"num_buffer_sampled": 1.0}, TypeError, "num_buffer_sampled must be an int"),
        ({"num_buffer_sampled": 1, "sample_from_all": True}, ValueError, "contradicts"),
        ({"sample_from_all": 1}, TypeError, "sample_from_all must be a bool"),
    ],
)
def test_sampler_ensemble_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        SamplerEnsemble(RandomSampler(), RandomSampler(), **kwargs)


def test_sampler_ensemble_bad_sample_calls_change_nothing():
    storages = _filled_storages(4, 0)
    sampler = SamplerEnsemble(RandomSampler(), RandomSampler())
    generator = torch.Generator().manual_seed(0)
    sampler.set_rng(generator)
    state = generator.get_state()
    with pytest.raises(ValueError, match=r"batch_size=5 cannot be split evenly among "
                                         r"num_buffer_sampled=2"):
        sampler.sample(storages, 5)
    with pytest.raises(RuntimeError, match=r"buffer\(s\) \[1\] of the ensemble are empty"):
        sampler.sample(storages, 4)
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        sampler.sample(storages, 0)
    with pytest.raises(TypeError, match="samples a StorageEnsemble"):
        sampler.sample(storages[0], 4)
    with pytest.raises(ValueError, match="3 storages but the SamplerEnsemble has 2"):
        sampler.sample(_filled_storages(1, 1, 1), 4)
    assert torch.equal(generator.get_state(), state)


def test_sampler_ensemble_setters_and_indexing():
    s0, s1, s2 = RandomSampler(), RandomSampler(), RandomSampler()
    sampler = SamplerEnsemble(s0, s1, s2, p=[1, 1, 2], num_buffer_sampled=2)
    assert sampler[1] is s1 and len(sampler) == 3
    sub = sampler[[0, 2]]
    torch.testing.assert_close(sub.p, torch.tensor([1 / 3, 2 / 3], dtype=torch.float64))
    assert sub.num_buffer_sampled == 2 and sub.samplers == (s0, s2)
    sampler.p = None
    assert sampler.p is None
    with pytest.raises(ValueError, match="p must hold non-negative"):
        sampler.p = [1, -1, 1]
    sampler.num_buffer_sampled = None
    assert sampler.num_buffer_sampled == 3
    sampler.num_buffer_sampled = 4  # more parts than buffers: drawn with replacement
    assert sampler.num_buffer_sampled == 4
    with pytest.raises(ValueError, match="num_buffer_sampled"):
        sampler.num_buffer_sampled = 0
    assert sampler.num_buffer_sampled == 4  # refused: unchanged
    everything = SamplerEnsemble(s0, s1, sample_from_all=True)
    with pytest.raises(ValueError, match="p cannot be set while sample_from_all"):
        everything.p = [1, 1]
    with pytest.raises(RuntimeError, match="not written through"):
        everything.extend(torch.tensor([0]))


@pytest.mark.parametrize("build", [
    lambda s: SamplerEnsemble(*s, p=[0.5, 0.5], sample_from_all=True),
    lambda s: SamplerEnsemble(*s, sample_from_all=True, num_buffer_sampled=3),
    lambda s: setattr(SamplerEnsemble(*s, sample_from_all=True), "p", [1, 1]),
    lambda s: ReplayBufferEnsemble(
        TensorDictReplayBuffer(storage=LazyTensorStorage(5)),
        TensorDictReplayBuffer(storage=LazyTensorStorage(5)), p=[0.2, 0.8],
        sample_from_all=True),
])
def test_sample_from_all_conflicts_are_the_runtime_error_torchrl_raises(build):
    # a plain ValueError: an except RuntimeError written for TorchRL missed it
    with pytest.raises(SampleFromAllConflictError) as caught:
        build((RandomSampler(), RandomSampler()))
    assert isinstance(caught.value, RuntimeError) and isinstance(caught.value, ValueError)


def test_sampler_ensemble_stacks_member_info():
    class InfoSampler(RandomSampler):
        def __init__(self, weight):
            super().__init__()
            self.weight = weight

        def sample(self, storage, batch_size):
            index, _ = super().sample(storage, batch_size)
            return index, {"priority_weight": torch.full((batch_size,), self.weight)}

    storages = _filled_storages(3, 3)
    sampler = SamplerEnsemble(InfoSampler(1.0), InfoSampler(2.0), sample_from_all=True)
    _, info = sampler.sample(storages, 4)
    assert info["priority_weight"].tolist() == [[1.0, 1.0], [2.0, 2.0]]


def test_sampler_ensemble_state_dict_and_checkpoint(tmp_path):
    from tdreplay.samplers import SamplerWithoutReplacement

    storages = _filled_storages(4, 4)
    sampler = SamplerEnsemble(SamplerWithoutReplacement(), SamplerWithoutReplacement(),
                              sample_from_all=True)
    sampler.set_rng(torch.Generator().manual_seed(0))
    sampler.sample(storages, 4)
    state = sampler.state_dict()
    sampler.dumps(tmp_path)
    expected = sampler.sample(storages, 4)[0]

    restored = SamplerEnsemble(SamplerWithoutReplacement(), SamplerWithoutReplacement(),
                               sample_from_all=True)
    restored.set_rng(torch.Generator().manual_seed(123))
    restored.prepare_load(tmp_path)()
    assert torch.equal(restored.sample(storages, 4)[0]["index"], expected["index"])

    by_state = SamplerEnsemble(SamplerWithoutReplacement(), SamplerWithoutReplacement(),
                               sample_from_all=True)
    by_state.load_state_dict(state)
    # the epoch is restored: the remaining slots of each buffer are the ones not drawn yet
    remaining = by_state.sample(storages, 4)[0]["index"]
    assert torch.equal(remaining.sort(-1).values, expected["index"].sort(-1).values)
    with pytest.raises(ValueError, match="keys"):
        by_state.check_state_dict({"0": state["0"]})
    with pytest.raises(CheckpointError, match="member 1 is a SamplerWithoutReplacement"):
        SamplerEnsemble(SamplerWithoutReplacement(), RandomSampler()).prepare_load(tmp_path)


# ---- WriterEnsemble ----------------------------------------------------------------------------


def test_writer_ensemble_refuses_writes_and_sums_counts(tmp_path):
    w0, w1 = RoundRobinWriter(), RoundRobinWriter()
    w0.register_storage(ListStorage(3))
    w1.register_storage(ListStorage(3))
    w0.extend([1, 2])
    w1.extend([1, 2, 3, 4])
    writers = WriterEnsemble(w0, w1)
    assert writers.write_count == 6 and writers[1] is w1 and len(writers) == 2
    assert writers[:1].writers == (w0,)
    with pytest.raises(RuntimeError, match="cannot write"):
        writers.extend([5])
    with pytest.raises(RuntimeError, match="cannot write"):
        writers.add(5)
    with pytest.raises(TypeError, match="works with a StorageEnsemble"):
        writers.register_storage(ListStorage(3))
    with pytest.raises(ValueError, match="1 storages but the WriterEnsemble has 2"):
        writers.register_storage(StorageEnsemble(ListStorage(3)))
    state = writers.state_dict()
    assert state == {"0": {"cursor": 2, "write_count": 2}, "1": {"cursor": 1, "write_count": 4}}
    writers.dumps(tmp_path)
    w0.extend([9])
    writers.empty()
    assert writers.write_count == 0 and w0.cursor == 0
    writers.prepare_load(tmp_path)()
    assert (w0.cursor, w0.write_count, w1.cursor, w1.write_count) == (2, 2, 1, 4)
    writers.load_state_dict({"0": {"cursor": 0, "write_count": 0}, "1": state["1"]})
    assert w0.write_count == 0
    with pytest.raises(ValueError, match="state_dict keys differ"):
        writers.load_state_dict({"0": {"cursor": 1}, "1": state["1"]})
    assert w0.write_count == 0 and w1.write_count == 4
    with pytest.raises(TypeError, match=r"writers\[0\] must be a Writer"):
        WriterEnsemble(RandomSampler())
    with pytest.raises(ValueError, match="at least one writer"):
        WriterEnsemble()


# ---- stack_parts -------------------------------------------------------------------------------


def test_stack_parts():
    a = TensorDict(obs=torch.zeros(2, 3), batch_size=[2])
    b = TensorDict(obs=torch.ones(2, 3), batch_size=[2])
    assert stack_parts([a, b]).batch_size == torch.Size([2, 2])
    hetero = stack_parts([a, TensorDict(obs=torch.ones(2, 5), batch_size=[2])])
    assert hetero.batch_size == torch.Size([2, 2])
    assert hetero[1]["obs"].shape == torch.Size([2, 5])
    ragged = stack_parts([a, TensorDict(obs=torch.ones(3, 3), batch_size=[3])])
    assert isinstance(ragged, list) and [p.batch_size[0] for p in ragged] == [2, 3]
    assert stack_parts([]) == []
    assert stack_parts(["x", "y"]) == ["x", "y"]


def test_parts_on_other_devices_stay_a_list():
    # (a LazyTensorStorage member's batch is on the CPU, a ListStorage member's has no device:
    # "RuntimeError: devices differ, got cpu and None")
    on_cpu = TensorDict(obs=torch.zeros(2, 3), batch_size=[2], device="cpu")
    anywhere = TensorDict(obs=torch.ones(2, 3), xz=torch.ones(2, 2), batch_size=[2])
    parts = stack_parts([on_cpu, anywhere])
    assert isinstance(parts, list) and parts[0] is on_cpu and parts[1] is anywhere
    # (parts of the same entries stack densely, whatever their devices)
    assert stack_parts([on_cpu, anywhere.exclude("xz")]).batch_size == torch.Size([2, 2])


def test_storage_ensemble_revision_follows_its_storages():
    first, second = LazyTensorStorage(4), LazyTensorStorage(4)
    first.set(torch.arange(4), TensorDict({"x": torch.zeros(4)}, [4]))
    ensemble = StorageEnsemble(first, second)
    seen = [ensemble.revision]
    first.set(0, TensorDict({"x": torch.ones(())}, []))  # a member written directly, same length
    seen.append(ensemble.revision)
    second.set(torch.arange(2), TensorDict({"x": torch.ones(2)}, [2]))
    seen.append(ensemble.revision)
    ensemble.empty()
    seen.append(ensemble.revision)
    assert len(set(seen)) == 4 and len(first) == 0 and len(second) == 0
