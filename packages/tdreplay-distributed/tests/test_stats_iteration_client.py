"""stats(), iteration (one epoch with a finite sampler, endless otherwise) and client() of
RayReplayBuffer and ShardedReplayBuffer, as TorchRL's RayReplayBuffer (issue 16)."""

from __future__ import annotations

import itertools
import pickle
from functools import partial

import pytest
import torch
from distributed_workers import make_batch
from tensordict import TensorDict

from tdreplay.core import ListStorage, ReplayBuffer, SamplerWithoutReplacement
from tdreplay.distributed import RayReplayBuffer, ShardedReplayBuffer
from tdreplay.storages import LazyTensorStorage


@pytest.fixture(scope="module")
def epochs(ray_session):
    """A buffer of 10 slots sampled without replacement, batches of 4."""
    rb = RayReplayBuffer(storage=partial(ListStorage, 10), sampler=SamplerWithoutReplacement,
                         batch_size=4)
    yield rb
    rb.close()


def _items(n: int) -> list[torch.Tensor]:
    return [torch.tensor(i) for i in range(n)]


def test_stats_values_and_keys_as_a_local_buffer(ray_session):
    rb = RayReplayBuffer(storage=partial(LazyTensorStorage, 100))
    try:
        assert rb.stats() == {"size": 0, "write_count": 0, "prefetch_queue_size": 0,
                              "initialized": True, "capacity": 100, "utilization": 0.0}
        rb.extend(TensorDict({"x": torch.ones(10, 2)}, batch_size=10))
        stats = rb.stats()
        assert stats == {"size": 10, "write_count": 10, "prefetch_queue_size": 0,
                         "initialized": True, "capacity": 100, "utilization": 0.1}
        local = ReplayBuffer(storage=LazyTensorStorage(100))
        local.extend(TensorDict({"x": torch.ones(10, 2)}, batch_size=10))
        assert stats == local.stats()
        assert rb.client().stats()["write_count"] == 10
    finally:
        rb.close()


def test_finite_sampler_iterates_one_epoch_like_a_local_buffer(epochs):
    epochs.empty()
    epochs.extend(_items(10))
    local = ReplayBuffer(storage=ListStorage(10), sampler=SamplerWithoutReplacement(),
                         batch_size=4)
    local.extend(_items(10))
    for _ in range(2):  # each loop is a whole epoch
        batches = [batch.tolist() for batch in epochs]
        assert [len(b) for b in batches] == [len(b) for b in local] == [4, 4, 2]
        assert sorted(itertools.chain(*batches)) == list(range(10))


def test_iteration_broken_off_goes_on_with_the_same_epoch(epochs):
    epochs.empty()
    epochs.extend(_items(10))
    first = next(iter(epochs)).tolist()
    rest = [batch.tolist() for batch in epochs]
    assert [len(first)] + [len(b) for b in rest] == [4, 4, 2]
    assert sorted(first + list(itertools.chain(*rest))) == list(range(10))


def test_next_gives_an_epoch_then_none_and_a_copy_its_own(epochs):
    # TorchRL's rb.next(): the iteration for code that cannot loop over the buffer
    epochs.empty()
    epochs.extend(_items(10))
    first = epochs.next().tolist()
    copy = pickle.loads(pickle.dumps(epochs))  # a client without the iteration
    rest = [epochs.next().tolist(), epochs.next().tolist()]
    assert [len(b) for b in [first, *rest]] == [4, 4, 2]
    assert sorted(first + list(itertools.chain(*rest))) == list(range(10))
    assert epochs.next() is None
    assert len(epochs.next()) == 4  # a new epoch
    assert len(copy.next()) == 4  # its own iteration of the same actor's sampler


def test_drop_last_epoch_ends_before_a_short_batch(ray_session):
    rb = RayReplayBuffer(storage=partial(ListStorage, 10), batch_size=4,
                         sampler=partial(SamplerWithoutReplacement, drop_last=True))
    try:
        rb.extend(_items(10))
        batches = [batch.tolist() for batch in rb]
        assert [len(b) for b in batches] == [4, 4]
        assert len(set(itertools.chain(*batches))) == 8
    finally:
        rb.close()


def test_sampler_with_replacement_iterates_endlessly_and_needs_a_batch_size(shared_td):
    # the session's shared buffer holds make_batch rows (its layout is that of its first write)
    shared_td.extend(make_batch(collector=0, seq=0, size=5))
    batches = list(itertools.islice(iter(shared_td), 6))
    assert [b.batch_size for b in batches] == [torch.Size([32])] * 6
    assert all(set(b["row"].tolist()) <= {0, 1, 2, 3, 4} for b in batches)


def test_client_sent_to_a_ray_actor_extends_the_owners_buffer(epochs, ray_session):
    epochs.empty()
    client = epochs.client()
    for name in ("close", "shutdown", "respawn", "client", "clients"):
        assert not hasattr(client, name)
    assert callable(client.extend) and client.batch_size == 4

    @ray_session.remote(num_cpus=0)
    class Collector:
        def __init__(self, rb):
            self.rb = rb

        def run(self):
            return self.rb.extend(_items(6)).tolist()

    collector = Collector.remote(client)
    assert ray_session.get(collector.run.remote()) == [0, 1, 2, 3, 4, 5]
    assert len(epochs) == 6 and epochs.write_count == 6
    copy = pickle.loads(pickle.dumps(client))
    assert sorted(itertools.chain(*[b.tolist() for b in copy])) == list(range(6))
    assert client[2].tolist() == 2 and len(client) == 6
    ray_session.kill(collector)


def test_clients_are_separate_and_checked(epochs):
    first, second = epochs.clients(2)
    assert first is not second and len(first) == len(second) == len(epochs)
    with pytest.raises(ValueError, match="num_clients"):
        epochs.clients(0)
    with pytest.raises(TypeError, match="num_clients"):
        epochs.clients(True)


def test_no_iteration_without_batch_size_and_no_client_once_closed(ray_session):
    rb = RayReplayBuffer(storage=partial(ListStorage, 4))
    rb.extend(_items(2))
    with pytest.raises(RuntimeError, match="Batch_size was not specified"):
        next(iter(rb))
    rb.close()
    with pytest.raises(RuntimeError, match="closed"):
        rb.client()


def test_sharded_stats_iteration_and_client(ray_session):
    rb = ShardedReplayBuffer(num_shards=2, storage=partial(ListStorage, 10), batch_size=5)
    try:
        rb.extend(_items(3))
        rb.extend(_items(2))
        rb.extend(_items(1))
        stats = rb.stats()
        assert stats == {"size": 6, "write_count": 6, "prefetch_queue_size": 0,
                         "initialized": True, "capacity": 20, "utilization": 0.3}
        assert stats.keys() == ReplayBuffer(storage=ListStorage(1)).stats().keys()
        batches = list(itertools.islice(iter(rb), 3))
        assert [len(b) for b in batches] == [5, 5, 5]
        client = rb.client()
        assert not hasattr(client, "close") and not hasattr(client, "shutdown")
        client.extend(_items(4))
        assert len(rb) == 10 and rb.stats()["write_count"] == 10
    finally:
        rb.close()


def test_sharded_finite_sampler_has_no_epoch(ray_session):
    rb = ShardedReplayBuffer(num_shards=2, storage=partial(ListStorage, 4), batch_size=2,
                             sampler=SamplerWithoutReplacement)
    try:
        rb.extend(_items(2))
        with pytest.raises(TypeError, match="shards"):
            next(iter(rb))
        assert [sorted(b.tolist()) for b in rb.shards[0]] == [[0, 1]]  # a shard's epoch
    finally:
        rb.close()
