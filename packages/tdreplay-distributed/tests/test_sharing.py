"""Ray buffers handed to Ray tasks and actors (pickled), and close()."""

from __future__ import annotations

import pickle
from functools import partial

import pytest
import torch
from distributed_workers import Worker, extend_in_task, make_batch

from tdreplay.core import ListStorage, TensorDictReplayBuffer
from tdreplay.distributed import (
    BufferActorDiedError,
    RayReplayBuffer,
    ShardedReplayBuffer,
    _ray,
)
from tdreplay.storages import LazyTensorStorage


@pytest.fixture(scope="module")
def _td_buffer(ray_session):
    rb = RayReplayBuffer(storage=partial(LazyTensorStorage, 1000),
                         replay_buffer_cls=TensorDictReplayBuffer, batch_size=16, prefetch=2)
    yield rb
    rb.close()


@pytest.fixture
def td_buffer(_td_buffer):
    """The module's buffer actor (prefetch=2), emptied."""
    _td_buffer.empty()
    return _td_buffer


@pytest.fixture(scope="module")
def workers(ray_session):
    """Two actors that collect into, or sample from, the buffers they are handed."""
    actors = [ray_session.remote(num_cpus=0)(Worker).remote() for _ in range(2)]
    yield actors
    for actor in actors:
        ray_session.kill(actor)


def test_a_pickled_buffer_is_a_client_of_the_same_actor(td_buffer):
    td_buffer.extend(make_batch(0, 0, 8))
    td_buffer.sample()  # two more samples are in flight (prefetch=2)
    copy = pickle.loads(pickle.dumps(td_buffer))
    assert copy.actor_id == td_buffer.actor_id and copy.name is None
    assert copy.extend(make_batch(1, 0, 4)).tolist() == [8, 9, 10, 11]
    assert len(td_buffer) == 12 and copy.write_count == 12
    assert copy.sample().batch_size == torch.Size([16])
    assert td_buffer.actor.__ray_ready__ is not None
    with pytest.raises(RuntimeError, match="creation arguments"):
        copy.respawn()  # only the creator rebuilds the actor


def test_two_collector_actors_extend_one_buffer_and_a_learner_actor_samples(ray_session,
                                                                           td_buffer, workers):
    ray_session.get([w.collect.remote(td_buffer, c, 5, 10) for w, c in zip(workers, (1, 2))],
                    timeout=120)
    assert len(td_buffer) == 100 and td_buffer.write_count == 100
    stored = td_buffer[:]
    for c in (1, 2):
        mine = stored[stored["collector"] == c]
        assert sorted(mine["seq"].tolist()) == sorted(list(range(5)) * 10)
    size, intact, seen = ray_session.get(workers[0].sample.remote(td_buffer, 500), timeout=120)
    assert size == 100 and intact and seen == [1, 2]


def test_a_ray_task_extends_the_buffer_it_is_handed(ray_session, td_buffer):
    task = ray_session.remote(num_cpus=0)(extend_in_task)
    slots = ray_session.get([task.remote(td_buffer, c, 3) for c in (1, 2)], timeout=120)
    assert sorted(slots[0] + slots[1]) == list(range(6)) and len(td_buffer) == 6


def test_a_sharded_buffer_is_handed_to_ray_actors(ray_session, workers):
    rb = ShardedReplayBuffer(num_shards=2, storage=partial(LazyTensorStorage, 100),
                             replay_buffer_cls=TensorDictReplayBuffer, batch_size=8)
    try:
        copy = pickle.loads(pickle.dumps(rb))
        assert copy.num_shards == 2 and copy.max_size == 200
        ray_session.get([w.collect.remote(rb, c, 2, 5) for w, c in zip(workers, (1, 2))],
                        timeout=120)
        assert len(rb) == 20 and [len(s) for s in rb.shards] == [10, 10]
        size, intact, seen = ray_session.get(workers[1].sample.remote(rb, 200), timeout=120)
        assert size == 20 and intact and seen == [1, 2]
    finally:
        rb.close()
    assert rb.closed
    with pytest.raises(BufferActorDiedError, match="closed"):
        len(rb)


def test_close_kills_the_actor_once_and_for_good(ray_session):
    rb = RayReplayBuffer(storage=partial(ListStorage, 10), batch_size=2)
    other = pickle.loads(pickle.dumps(rb))
    rb.extend([1, 2, 3])
    assert not rb.closed
    rb.close()
    rb.close()  # twice: nothing
    assert rb.closed
    with pytest.raises(BufferActorDiedError, match="closed"):
        rb.extend([4])
    with pytest.raises(BufferActorDiedError):  # other clients find the actor dead
        len(other)
    with pytest.raises(RuntimeError, match="closed buffer cannot be respawned"):
        rb.respawn()


def test_close_after_shutdown_or_a_dead_actor_is_quiet(ray_session):
    rb = RayReplayBuffer(storage=partial(ListStorage, 10))
    rb.shutdown()
    rb.close()
    assert rb.closed


class FakeRay:
    def __init__(self, initialized: bool) -> None:
        self.initialized = initialized
        self.calls: list[str] = []

    def is_initialized(self) -> bool:
        return self.initialized

    def init(self, **kwargs) -> None:
        self.calls.append(f"init {kwargs}")
        self.initialized = True

    def shutdown(self) -> None:
        self.calls.append("shutdown")
        self.initialized = False


@pytest.fixture
def no_leases(monkeypatch):
    """The process's lease count as if no buffer held Ray (the session's buffers do)."""
    monkeypatch.setattr(_ray.RayLease, "_count", 0)
    monkeypatch.setattr(_ray.RayLease, "_owns_runtime", False)


def test_ray_started_by_the_buffers_is_shut_down_when_the_last_one_closes(monkeypatch,
                                                                           no_leases):
    fake = FakeRay(initialized=False)
    monkeypatch.setattr(_ray, "import_ray", lambda: fake)
    first = _ray.RayLease.acquire({"num_cpus": 1})
    second = _ray.RayLease.acquire(None)
    assert fake.calls == ["init {'num_cpus': 1}"]
    first.release()
    first.release()  # counted once
    assert fake.initialized
    second.release()
    assert fake.calls[-1] == "shutdown" and not fake.initialized


def test_ray_started_by_the_user_stays_up(monkeypatch, no_leases):
    fake = FakeRay(initialized=True)
    monkeypatch.setattr(_ray, "import_ray", lambda: fake)
    lease = _ray.RayLease.acquire({"num_cpus": 1})
    lease.release()
    assert fake.calls == [] and fake.initialized


def test_a_ray_buffer_iterates_batches_not_items(td_buffer):
    """TorchRL's iteration (batches of batch_size), not Python's fallback over rb[i]."""
    td_buffer.extend(make_batch(0, 0, 4))
    batches = iter(td_buffer)
    assert [next(batches).batch_size for _ in range(3)] == [torch.Size([td_buffer.batch_size])] * 3
