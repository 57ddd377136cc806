"""Recovery: Ray restarts, respawn races, dead shards, clear messages."""

from __future__ import annotations

import os
import signal
import threading
import time
import warnings
from functools import partial

import pytest
import torch
from distributed_workers import make_batch, retry_until, until_dead
from tensordict import TensorDict

from tdreplay.core import ListStorage, TensorDictReplayBuffer
from tdreplay.distributed import (
    BufferActorDiedError,
    BufferNotFoundError,
    BufferStartError,
    BufferStateLostError,
    RayReplayBuffer,
    RemoteBufferError,
    ShardedReplayBuffer,
    ShardsUnavailableWarning,
)
from tdreplay.samplers import TensorDictPrioritizedReplayBuffer
from tdreplay.storages import LazyTensorStorage


def _until(call, accept=(RemoteBufferError,), timeout=60.0):
    return retry_until(call, accept, timeout)


def _restarting(tmp_path=None) -> RayReplayBuffer:
    return RayReplayBuffer(storage=partial(LazyTensorStorage, 100),
                           name=f"restarting-{tmp_path is None}",
                           replay_buffer_cls=TensorDictReplayBuffer,
                           remote_config={"max_restarts": 1},
                           # an fsspec URL (a shared path is used in test_multinode)
                           checkpoint_path=None if tmp_path is None
                           else f"file://{tmp_path}/ckpt")


def test_a_restarted_actor_restores_its_checkpoint_path(ray_session, tmp_path):
    rb = _restarting(tmp_path)
    try:
        rb.extend(make_batch(0, 0, 10))
        rb.dumps()  # to checkpoint_path
        rb.extend(make_batch(0, 1, 5))  # after the checkpoint: lost with the actor
        pid = rb.actor_info["pid"]
        os.kill(rb.actor_info["pid"], signal.SIGKILL)  # the actor's process crashes

        def restarted():
            rb.reconnect()
            assert rb.actor_info["pid"] != pid

        _until(restarted, accept=(RemoteBufferError, AssertionError))
        assert len(rb) == 10 and rb[:]["seq"].tolist() == [0] * 10
    finally:
        rb.shutdown()


def test_a_restarted_actor_without_checkpoint_refuses_every_call(ray_session):
    rb = _restarting()
    try:
        rb.extend(make_batch(0, 0, 10))
        os.kill(rb.actor_info["pid"], signal.SIGKILL)  # the actor's process crashes

        def length():
            try:
                len(rb)
            except BufferStateLostError:
                raise
            except RemoteBufferError:
                raise TimeoutError from None  # restarting: try again
            raise TimeoutError  # the old actor, not dead yet

        with pytest.raises(BufferStateLostError, match="restarted by Ray.*no checkpoint_path"
                           ".*respawn") as err:
            _until(length, accept=(TimeoutError,))
        assert isinstance(err.value, BufferActorDiedError)
        with pytest.raises(BufferStateLostError):
            rb.extend(make_batch(0, 1, 1))
        rb.respawn()  # the way out: a new (here empty) buffer, by choice
        assert len(rb) == 0
    finally:
        rb.shutdown()


def test_a_client_reconnecting_during_respawn_never_sees_a_partial_buffer(ray_session,
                                                                           tmp_path):
    rb = RayReplayBuffer(storage=partial(LazyTensorStorage, 50_000),
                         replay_buffer_cls=TensorDictReplayBuffer, name="respawn-race")
    try:
        for seq in range(4):
            rb.extend(make_batch(0, seq, 5_000))
        rb.dumps(tmp_path / "ckpt")
        seen, stop = [], threading.Event()

        def writer_reconnecting():
            other = RayReplayBuffer.attach("respawn-race")
            while not stop.is_set():
                try:
                    other.reconnect()
                    seen.append(len(other))
                except (BufferActorDiedError, BufferNotFoundError):
                    pass  # the old actor is gone, the new one not named yet
                time.sleep(0.01)

        thread = threading.Thread(target=writer_reconnecting)
        thread.start()
        time.sleep(0.2)
        rb.respawn(tmp_path / "ckpt")
        time.sleep(0.5)
        stop.set()
        thread.join(60)
        assert seen and set(seen) == {20_000}
    finally:
        rb.shutdown()


def test_reconnect_before_respawn_says_what_to_do(ray_session):
    rb = RayReplayBuffer(storage=partial(ListStorage, 10), name="gone-buffer")
    other = RayReplayBuffer.attach("gone-buffer")
    rb.shutdown()

    def name_released():
        try:
            other.reconnect()
        except BufferNotFoundError:
            return
        except BufferActorDiedError:
            pass
        raise TimeoutError  # still named

    _until(name_released, accept=(TimeoutError,))
    with pytest.raises(BufferNotFoundError, match="respawn.*then reconnect") as err:
        other.reconnect()
    assert isinstance(err.value, ValueError)
    rb.respawn()
    other.reconnect()
    assert len(other) == 0
    rb.shutdown()


def test_an_actor_that_cannot_be_scheduled_says_so(ray_session):
    with pytest.raises(BufferStartError, match="did not start within 2.0 s.*could not schedule"
                       ".*no_such_resource") as err:
        RayReplayBuffer(storage=partial(ListStorage, 10), start_timeout=2.0,
                        remote_config={"resources": {"no_such_resource": 1}})
    assert "call_timeout" not in str(err.value) and "applied later" not in str(err.value)


@pytest.fixture
def two_shards(ray_session, tmp_path):
    rb = ShardedReplayBuffer(num_shards=2, storage=partial(LazyTensorStorage, 100),
                             replay_buffer_cls=TensorDictReplayBuffer, batch_size=60,
                             generator=torch.Generator().manual_seed(0))
    yield rb
    rb.shutdown()


def test_one_dead_shard_leaves_the_others_serving_and_only_it_is_respawned(two_shards,
                                                                           ray_session,
                                                                           tmp_path):
    rb = two_shards
    for collector in range(2):
        rb.extend(make_batch(collector, 0, 10))  # shard k holds collector k
    rb.dumps(tmp_path / "ckpt")
    rb.extend(make_batch(3, 0, 5))  # shard 0: newer than the checkpoint
    live_pid = rb.shards[0].actor_info["pid"]
    ray_session.kill(rb.shards[1].actor)
    until_dead(rb.shards[1])
    with pytest.warns(ShardsUnavailableWarning, match="shard 1 is unavailable"):
        data, info = _until(lambda: rb.sample(return_info=True), accept=())
    assert info["dead_shards"] == (1,) and rb.dead_shards == (1,)
    assert set(data["collector"].tolist()) == {0, 3}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # told once
        assert len(rb) == 15
        slots = rb.extend(make_batch(4, 0, 2))  # the write skips the dead shard
    assert not (100 <= int(slots[0]) < 200)
    rb.respawn(tmp_path / "ckpt")  # only the dead shard
    assert rb.dead_shards == () and rb.shards[0].actor_info["pid"] == live_pid
    assert [len(s) for s in rb.shards] == [17, 10]
    assert len(rb) == 27


def test_new_items_get_the_global_max_priority(ray_session):
    rb = ShardedReplayBuffer(num_shards=2, storage=partial(LazyTensorStorage, 50),
                             replay_buffer_cls=TensorDictPrioritizedReplayBuffer, alpha=1.0,
                             beta=0.5, sampler_backend="torch", batch_size=10)
    try:
        first = rb.extend(make_batch(0, 0, 4))  # shard 0
        rb.update_priority(first, torch.full((4,), 10.0))
        rb.extend(make_batch(1, 0, 4))  # shard 1: gets 10, not its own max 1
        total, _, n, top = ray_session.get(rb.shards[1].actor.sampling_mass.remote())
        assert n == 4 and top == pytest.approx(10.0) and total == pytest.approx(40.0, rel=1e-6)
    finally:
        rb.shutdown()
    # data with its own priorities keeps them (its batches all carry them: every shard of a
    # sharded buffer holds the same entries)
    rb = ShardedReplayBuffer(num_shards=2, storage=partial(LazyTensorStorage, 50),
                             replay_buffer_cls=TensorDictPrioritizedReplayBuffer, alpha=1.0,
                             beta=0.5, sampler_backend="torch", batch_size=10)
    try:
        first = make_batch(0, 0, 2).set("td_error", torch.tensor([1.0, 1.0]))
        rb.update_priority(rb.extend(first), torch.full((2,), 10.0))  # shard 0
        rb.extend(make_batch(2, 0, 2).set("td_error", torch.tensor([3.0, 4.0])))  # shard 1
        total, _, n, _ = ray_session.get(rb.shards[1].actor.sampling_mass.remote())
        assert n == 2 and total == pytest.approx(7.0, rel=1e-6)
    finally:
        rb.shutdown()


@pytest.mark.filterwarnings("ignore::tdreplay.distributed.ShardsUnavailableWarning")
def test_sharded_prefetch_and_per_shard_options(ray_session):
    rb = ShardedReplayBuffer(num_shards=2, storage=partial(ListStorage, 20), batch_size=8,
                             remote_config=[{"num_cpus": 0}, {"num_cpus": 0,
                                                              "max_concurrency": 2}],
                             prefetch=2, name="prefetched")
    try:
        rb.extend(list(range(5)))
        rb.extend(list(range(100, 105)))
        learner = ShardedReplayBuffer.attach("prefetched", prefetch=3)
        for buffer in (rb, learner):
            batches = [buffer.sample() for _ in range(5)]
            assert all(len(b) == 8 for b in batches)
        assert {v for b in batches for v in b} <= set(range(5)) | set(range(100, 105))
        rb.empty()
        with pytest.raises(RuntimeError, match="empty"):
            rb.sample()
    finally:
        rb.shutdown()
    with pytest.raises(ValueError, match="one dict per shard"):
        ShardedReplayBuffer(num_shards=2, remote_config=[{}])


@pytest.mark.parametrize("how", ["update_priority", "update_tensordict_priority"])
def test_a_priority_update_after_a_shard_died_sets_it_aside(ray_session, how):
    # (update_priority's check raised BufferActorDiedError and left the shard unmarked, so a
    # learner retrying got the same error; the tensordict form set it aside, as documented)
    rb = ShardedReplayBuffer(num_shards=2, storage=partial(LazyTensorStorage, 10),
                             replay_buffer_cls=TensorDictPrioritizedReplayBuffer, alpha=1.0,
                             beta=1.0, batch_size=4, name=f"dying-{how}")
    try:
        rb.extend(TensorDict({"x": torch.arange(2.0)}, [2]))
        rb.extend(TensorDict({"x": torch.arange(2.0)}, [2]))
        ray_session.kill(rb.shards[1].actor)
        until_dead(rb.shards[1])
        index, priority = torch.tensor([0, 1, 10, 11]), torch.tensor([5.0, 5.0, 7.0, 7.0])
        with pytest.warns(ShardsUnavailableWarning, match="shard 1 is unavailable"):
            if how == "update_priority":
                rb.update_priority(index, priority)
            else:
                rb.update_tensordict_priority(TensorDict({"index": index, "td_error": priority},
                                                         [4]))
        assert rb.dead_shards == (1,)
        state = rb.shards[0].state_dict()["_sampler"]["priorities"]
        assert state[:2].tolist() == pytest.approx([5.0, 5.0])
    finally:
        rb.shutdown()


def test_respawn_without_a_path_restores_checkpoint_path(ray_session, tmp_path):
    # respawn() ignored checkpoint_path: the new actor started empty (the 3 rows saved lost)
    rb = RayReplayBuffer(storage=partial(ListStorage, 10), checkpoint_path=tmp_path / "ckpt")
    try:
        rb.respawn()  # nothing saved there yet: a new empty buffer
        assert len(rb) == 0
        rb.extend([1, 2, 3])
        rb.dumps()
        rb.extend([4])  # after the checkpoint: lost with the actor
        ray_session.kill(rb.actor)
        until_dead(rb)
        rb.respawn()
        assert list(rb[:]) == [1, 2, 3]
    finally:
        rb.shutdown()


def test_sharded_respawn_without_a_path_restores_checkpoint_path(ray_session, tmp_path):
    rb = ShardedReplayBuffer(num_shards=2, storage=partial(LazyTensorStorage, 100),
                             replay_buffer_cls=TensorDictReplayBuffer,
                             checkpoint_path=tmp_path / "ckpt")
    try:
        for collector in range(2):
            rb.extend(make_batch(collector, 0, 10))  # shard k holds collector k
        rb.dumps()
        rb.extend(make_batch(3, 0, 5))  # shard 0: newer than the checkpoint, kept
        ray_session.kill(rb.shards[1].actor)
        until_dead(rb.shards[1])
        with pytest.warns(ShardsUnavailableWarning, match="shard 1 is unavailable"):
            rb.respawn()  # the dead shard, from checkpoint_path/shard-1
        assert [len(s) for s in rb.shards] == [15, 10]
    finally:
        rb.shutdown()
