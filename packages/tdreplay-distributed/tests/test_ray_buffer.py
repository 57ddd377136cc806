"""RayReplayBuffer: the buffer in a Ray actor, its forwarded methods, names and errors."""

from __future__ import annotations

import sys
from functools import partial

import pytest
import torch
from distributed_workers import make_batch, rows_are_intact
from tensordict import TensorDict

from tdreplay.core import ListStorage, ReplayBuffer, TensorDictReplayBuffer
from tdreplay.distributed import RayReplayBuffer
from tdreplay.samplers import TensorDictPrioritizedReplayBuffer
from tdreplay.storages import LazyTensorStorage


@pytest.fixture(scope="module")
def prioritized(ray_session):
    rb = RayReplayBuffer(storage=partial(LazyTensorStorage, 16),
                         replay_buffer_cls=TensorDictPrioritizedReplayBuffer, alpha=1.0, beta=1.0,
                         sampler_backend="torch", batch_size=64)
    yield rb
    rb.shutdown()


def test_extend_add_sample_and_counts(shared_td):
    batch = make_batch(0, 0, 10)
    assert shared_td.extend(batch).tolist() == list(range(10))
    assert "index" not in batch.keys()  # the caller's data is left as it is (TorchRL 0.14.1)
    one = make_batch(1, 0, 1)[0]
    assert shared_td.add(one) == 10
    assert "index" not in one.keys()
    assert len(shared_td) == 11 and shared_td.write_count == 11
    data, info = shared_td.sample(return_info=True)
    assert data.batch_size == torch.Size([32])
    assert rows_are_intact(data)
    assert torch.equal(data["index"], info["index"])
    assert data["index"].min() >= 0 and data["index"].max() <= 10
    # the rows sampled are the rows written at those slots
    expected_collector = (info["index"] == 10).long()
    assert torch.equal(data["collector"], expected_collector)
    first = shared_td[:3]
    assert first["row"].tolist() == [0, 1, 2] and rows_are_intact(first)


def test_sample_batch_size_default_and_explicit(shared_td):
    shared_td.extend(make_batch(0, 0, 5))
    assert shared_td.batch_size == 32
    assert shared_td.sample(7).batch_size == torch.Size([7])


def test_buffer_errors_keep_their_type_and_leave_the_buffer_unchanged(shared_td):
    shared_td.extend(make_batch(0, 0, 6))
    before = shared_td[:]
    with pytest.raises(ValueError, match="batch_size"):
        shared_td.sample(0)
    with pytest.raises(TypeError, match="expects a TensorDict"):
        shared_td.extend(torch.zeros(3))
    assert len(shared_td) == 6 and shared_td.write_count == 6
    assert torch.equal(shared_td[:]["obs"], before["obs"])


def test_extend_of_a_generator_writes_its_items(ray_session):
    # (a local buffer takes any iterable; the remote one failed to pickle the generator)
    rb = RayReplayBuffer(storage=partial(ListStorage, 10))
    try:
        assert rb.extend(i * 10 for i in range(3)).tolist() == [0, 1, 2]
        with pytest.raises(TypeError, match="does not pickle"):
            rb.add(lambda: 1)
        assert len(rb) == 3 and [rb[i] for i in range(3)] == [0, 10, 20]
    finally:
        rb.shutdown()


def test_setitem_and_getitem_are_forwarded(shared_td):
    shared_td.extend(make_batch(0, 0, 4))
    shared_td[torch.tensor([1, 2])] = make_batch(5, 9, 2)
    stored = shared_td[:]
    assert stored["collector"].tolist() == [0, 5, 5, 0]
    assert rows_are_intact(stored)


def test_attach_by_name_shares_the_buffer(shared_td):
    other = RayReplayBuffer.attach("shared-td")
    assert other.name == "shared-td" and other.batch_size == 32
    other.extend(make_batch(3, 0, 4))
    shared_td.extend(make_batch(4, 0, 2))
    assert len(shared_td) == len(other) == 6
    assert shared_td[:]["collector"].tolist() == [3, 3, 3, 3, 4, 4]
    assert RayReplayBuffer.from_name("shared-td").write_count == 6


def test_prefetch_keeps_samples_in_flight_for_one_client(shared_td):
    shared_td.extend(make_batch(0, 0, 10))
    learner = RayReplayBuffer.attach("shared-td", prefetch=2)
    for _ in range(4):
        data = learner.sample()
        assert data.batch_size == torch.Size([32]) and rows_are_intact(data)
    assert learner.sample(5).batch_size == torch.Size([5])  # another size: not prefetched
    learner.empty()  # drops this client's samples in flight
    with pytest.raises(RuntimeError, match="empty"):
        learner.sample()
    learner.extend(make_batch(1, 0, 3))
    assert set(learner.sample()["collector"].tolist()) == {1}


def test_attach_to_an_unknown_name_says_so(ray_session):
    with pytest.raises(ValueError, match="no buffer actor named 'nobody'"):
        RayReplayBuffer.attach("nobody")


def test_a_taken_name_is_refused(shared_td):
    with pytest.raises(ValueError, match="'shared-td' already exists.*attach"):
        RayReplayBuffer(storage=partial(ListStorage, 5), name="shared-td")
    assert len(shared_td) == 0  # the existing buffer is untouched


@pytest.mark.parametrize("kwargs, error, match", [
    ({"storage": 42}, TypeError, "storage must be a Storage"),
    ({"sampler": "random"}, TypeError, "sampler must be a Sampler"),
    ({"replay_buffer_cls": dict}, TypeError, "replay_buffer_cls must be a ReplayBuffer"),
    ({"remote_config": ["num_cpus"]}, TypeError, "remote_config must be a dict"),
    ({"call_timeout": 0}, ValueError, "call_timeout must be a positive number"),
    ({"name": ""}, TypeError, "name must be a non-empty str"),
    ({"ray_init_config": "auto"}, TypeError, "ray_init_config must be a dict"),
    ({"prefetch": -1}, ValueError, "prefetch must be >= 0, got -1"),
])
def test_bad_arguments_are_refused_before_any_actor_starts(ray_session, kwargs, error, match):
    with pytest.raises(error, match=match):
        RayReplayBuffer(**kwargs)


def test_a_buffer_that_cannot_be_built_raises_its_own_error(ray_session):
    with pytest.raises(TypeError, match="storage factory .* returned a int"):
        RayReplayBuffer(storage=lambda: 42, name="never-built")
    with pytest.raises(ValueError, match="no buffer actor named"):  # the actor was removed
        RayReplayBuffer.attach("never-built")


def test_dumps_loads_and_state_dict_round_trip(shared_td, tmp_path):
    shared_td.extend(make_batch(0, 0, 5))
    shared_td.dumps(tmp_path / "ckpt")
    state = shared_td.state_dict()
    saved = shared_td[:]
    shared_td.extend(make_batch(1, 0, 3))
    shared_td.loads(tmp_path / "ckpt")
    assert len(shared_td) == 5 and shared_td.write_count == 5
    assert torch.equal(shared_td[:]["obs"], saved["obs"])
    shared_td.extend(make_batch(2, 0, 7))
    shared_td.load_state_dict(state)
    assert len(shared_td) == 5 and shared_td.write_count == 5
    assert torch.equal(shared_td[:]["collector"], saved["collector"])
    # and the restored buffer keeps writing after the restored rows
    assert shared_td.extend(make_batch(3, 0, 2)).tolist() == [5, 6]


def test_prioritized_updates_change_what_is_sampled(prioritized):
    prioritized.empty()
    data = TensorDict({"x": torch.arange(4.0)}, [4])
    prioritized.extend(data)
    prioritized.update_priority(torch.arange(4), torch.tensor([0.0, 0.0, 0.0, 5.0]))
    sample = prioritized.sample()
    assert sample["index"].unique().tolist() == [3]
    assert torch.equal(sample["x"], torch.full((64,), 3.0))
    assert "priority_weight" in sample.keys() and "write_generation" in sample.keys()
    # priorities computed on a sample go back through the sample's entries
    sample["td_error"] = torch.zeros(64)
    prioritized.update_priority(torch.tensor([1]), torch.tensor([7.0]))
    prioritized.update_tensordict_priority(sample)  # slot 3 -> 0
    assert prioritized.sample()["index"].unique().tolist() == [1]


def test_prioritized_weights_follow_the_priorities(prioritized):
    prioritized.empty()
    prioritized.extend(TensorDict({"x": torch.arange(2.0)}, [2]))
    prioritized.update_priority(torch.tensor([0, 1]), torch.tensor([1.0, 4.0]))
    data, info = prioritized.sample(return_info=True)
    expected = torch.where(info["index"] == 0, 1.0, 0.25)  # (p / p_min) ** -beta, beta = 1
    assert torch.allclose(info["priority_weight"], expected, rtol=1e-5)
    assert torch.allclose(data["priority_weight"], expected, rtol=1e-5)


def test_update_tensordict_priority_needs_a_tensordict(prioritized):
    with pytest.raises(TypeError, match="data must be a TensorDict"):
        prioritized.update_tensordict_priority(torch.zeros(2))


def test_as_remote_gives_the_actor_class_of_a_buffer_class(ray_session):
    actor = TensorDictReplayBuffer.as_remote({"num_cpus": 0}).remote(storage=ListStorage(10),
                                                                     batch_size=2)
    try:
        td = TensorDict({"a": torch.arange(3)}, [3])
        assert ray_session.get(actor.extend.remote(td)).tolist() == [0, 1, 2]
        assert ray_session.get(actor.__len__.remote()) == 3
        assert ray_session.get(actor.sample.remote())["a"].shape == (2,)
    finally:
        ray_session.kill(actor)
    # (Ray's actor class of RayReplayBuffer reads the repr of an instance without a client:
    # AttributeError '_client')
    assert "RayReplayBuffer" in repr(RayReplayBuffer.as_remote({"num_cpus": 0}))


def test_as_remote_without_ray_names_the_package_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # "import ray" fails
    with pytest.raises(ImportError, match="tdreplay-distributed"):
        ReplayBuffer.as_remote()
