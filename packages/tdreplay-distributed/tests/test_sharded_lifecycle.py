"""A sharded buffer whose shards all died, was closed, or was restarted by Ray; its
``load_state_dict`` (all shards or none), ``dumps()`` / ``loads()`` to its
``checkpoint_path``, and batches that would split its shards' layouts. Runs on the session's
local Ray instance (conftest.py)."""

from __future__ import annotations

import copy
import pickle
import time
from functools import partial

import pytest
import torch
from distributed_workers import make_batch, until_dead
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.distributed import (
    BufferActorDiedError,
    RemoteBufferError,
    ShardedReplayBuffer,
    ShardsUnavailableWarning,
)
from tdreplay.samplers import TensorDictPrioritizedReplayBuffer
from tdreplay.storages import LazyTensorStorage

pytestmark = pytest.mark.filterwarnings(
    "ignore::tdreplay.distributed.ShardsUnavailableWarning")


def _buffer(**kwargs) -> ShardedReplayBuffer:
    return ShardedReplayBuffer(num_shards=2, storage=partial(LazyTensorStorage, 10),
                               replay_buffer_cls=TensorDictReplayBuffer, batch_size=4, **kwargs)


def _ids(rb: ShardedReplayBuffer) -> list[list[int]]:
    return [s[torch.arange(len(s))]["collector"].tolist() if len(s) else [] for s in rb.shards]


def test_respawn_rebuilds_every_shard_when_all_are_dead(ray_session, tmp_path):
    # (it raised "every shard of the buffer is dead: respawn(path) it")
    rb = _buffer()
    try:
        rb.extend(make_batch(0, 0, 3))
        rb.extend(make_batch(1, 0, 2))
        rb.dumps(tmp_path / "ckpt")
        for shard in rb.shards:
            ray_session.kill(shard.actor)
        for shard in rb.shards:
            until_dead(shard)
        with pytest.raises(BufferActorDiedError, match="every shard of the buffer is dead"):
            len(rb)
        rb.respawn(tmp_path / "ckpt")
        assert rb.dead_shards == () and len(rb) == 5
        assert [len(s) for s in rb.shards] == [3, 2]
    finally:
        rb.shutdown()


def _prioritized() -> ShardedReplayBuffer:
    rb = ShardedReplayBuffer(num_shards=2, storage=partial(LazyTensorStorage, 20),
                             replay_buffer_cls=TensorDictPrioritizedReplayBuffer, alpha=0.7,
                             beta=0.5, batch_size=8)
    rb.extend(TensorDict({"x": torch.arange(5.0)}, [5]))
    rb.extend(TensorDict({"x": torch.arange(5.0)}, [5]))
    return rb


@pytest.mark.parametrize("how", ["client of a closed buffer", "copy of a closed buffer",
                                 "every shard killed"])
def test_priority_updates_raise_once_no_shard_is_left(ray_session, how):
    # (they returned normally, changing nothing, while len / sample / extend raised)
    rb = _prioritized()
    sample = rb.sample()
    index = sample["index"]
    sample.set("td_error", torch.ones(8))
    user = rb
    if how == "every shard killed":
        for shard in rb.shards:
            ray_session.kill(shard.actor)
        for shard in rb.shards:
            until_dead(shard)
    else:
        user = rb.client() if how.startswith("client") else pickle.loads(pickle.dumps(rb))
        rb.close()
    calls = {"update_priority": lambda: user.update_priority(index, 2.0),
             "update_tensordict_priority": lambda: user.update_tensordict_priority(sample),
             "len": lambda: len(user)}
    try:
        for name in [*calls, *calls]:  # each one again once no shard is known to be left
            with pytest.raises(BufferActorDiedError, match="dead|closed"):
                calls[name]()
    finally:
        rb.close()


@pytest.mark.parametrize("how", ["update_priority", "update_tensordict_priority"])
def test_a_priority_update_of_one_shard_raises_when_no_shard_is_left(ray_session, how):
    # (an index naming shard 0 only returned normally: shard 0 was marked dead, shard 1 was
    # not asked, so the update was dropped as if other shards lived)
    rb = _prioritized()
    try:
        for shard in rb.shards:
            ray_session.kill(shard.actor)
        for shard in rb.shards:
            until_dead(shard)
        update = {"update_priority": lambda: rb.update_priority(torch.tensor([0]), 2.0),
                  "update_tensordict_priority": lambda: rb.update_tensordict_priority(
                      TensorDict({"index": torch.tensor([0]), "td_error": torch.ones(1)},
                                 [1]))}[how]
        with pytest.raises(BufferActorDiedError, match="every shard of the buffer is dead"):
            update()
    finally:
        rb.shutdown()


def test_a_priority_update_still_drops_a_dead_shards_part_while_others_live(ray_session):
    rb = _prioritized()
    try:
        ray_session.kill(rb.shards[1].actor)
        until_dead(rb.shards[1])
        with pytest.warns(ShardsUnavailableWarning, match="shard 1"):
            rb.update_priority(torch.tensor([0, 20]), 3.0)
        assert rb.dead_shards == (1,)
        rb.update_priority(torch.tensor([1, 21]), 3.0)  # (quietly, as documented)
        assert rb.shards[0].state_dict()["_sampler"]["priorities"][:2].tolist() == \
            pytest.approx([3.0 ** 0.7] * 2)
    finally:
        rb.shutdown()


def test_load_state_dict_refused_by_one_shard_changes_no_shard(ray_session):
    # (shard 0 loaded before shard 1 refused its part: the buffer was left half restored)
    source, rb = _buffer(), _buffer()
    try:
        source.extend(make_batch(1, 0, 5))
        source.extend(make_batch(2, 0, 5))
        state = source.state_dict()
        bad = copy.deepcopy(state)
        bad["shards"][1]["_storage"]["max_size"] = 11
        rb.extend(make_batch(8, 0, 3))
        rb.extend(make_batch(9, 0, 3))
        before = _ids(rb)
        with pytest.raises(ValueError, match=r"shard 1: state_dict\['_storage'\].*max_size"):
            rb.load_state_dict(bad)
        assert _ids(rb) == before and len(rb) == 6
        with pytest.raises(ValueError, match=r"entries \['bogus'\] that a ShardedReplayBuffer"):
            rb.load_state_dict({**state, "bogus": 1})  # (was taken without a word)
        assert _ids(rb) == before
        rb.load_state_dict(state)  # a good one loads into every shard
        assert _ids(rb) == [[1] * 5, [2] * 5] and len(rb) == 10
        assert rb.sample(32)["collector"].unique().tolist() == [1, 2]
    finally:
        source.shutdown()
        rb.shutdown()


def test_dumps_and_loads_default_to_the_checkpoint_path(ray_session, tmp_path):
    # (dumps() raised TypeError although checkpoint_path was given)
    rb = _buffer(checkpoint_path=tmp_path / "ckpt")
    try:
        assert rb.checkpoint_path == str(tmp_path / "ckpt")
        rb.extend(make_batch(1, 0, 3))
        rb.dumps()
        assert (tmp_path / "ckpt" / "sharded.json").exists()
        rb.extend(make_batch(2, 0, 2))
        rb.loads()
        assert _ids(rb) == [[1] * 3, []]
    finally:
        rb.shutdown()
    plain = _buffer()
    try:
        with pytest.raises(ValueError, match="no checkpoint path: pass path"):
            plain.dumps()
    finally:
        plain.shutdown()


@pytest.mark.parametrize("shard", ["laid out", "not laid out"])
def test_a_batch_with_an_extra_entry_is_refused_and_writes_nothing(ray_session, shard):
    # (a LazyTensorStorage shard added the entry: the shards' layouts split and every later
    # sample failed with KeyError)
    rb = _buffer(write_strategy="least_written")
    try:
        rb.extend(make_batch(1, 0, 3))                       # shard 0
        if shard == "laid out":
            rb.extend(make_batch(2, 0, 4))                   # shard 1; the next goes to 0
        before, count = _ids(rb), rb.write_count
        extra = make_batch(3, 0, 2).set("extra", torch.ones(2))
        with pytest.raises(KeyError, match=r"missing \[\], unexpected \['extra'\].*Nothing "
                                           "was written"):
            rb.extend(extra)
        with pytest.raises(KeyError, match=r"unexpected \['extra'\]"):
            rb.add(extra[0])
        assert _ids(rb) == before and rb.write_count == count
        rb.extend(make_batch(4, 0, 2))
        sample = rb.sample(32)
        assert "extra" not in sample.keys() and len(rb) == count + 2
    finally:
        rb.shutdown()


def test_a_shard_restarted_by_ray_is_used_again_once_it_answers(ray_session, tmp_path):
    # (the one "actor is restarting" error set the shard aside for good)
    rb = _buffer(checkpoint_path=tmp_path / "ckpt", remote_config={"max_restarts": 1})
    try:
        rb.extend(make_batch(1, 0, 3))
        rb.extend(make_batch(2, 0, 4))
        rb.dumps()                                    # what a restarted shard restores
        old = rb.shards[1].actor_info["pid"]
        ray_session.kill(rb.shards[1].actor, no_restart=False)
        lengths = []
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:
            try:
                lengths.append(len(rb))
            except RemoteBufferError:
                lengths.append(None)
            if lengths[-1] == 7 and any(n != 7 for n in lengths):
                break  # (shard 1 was left out while Ray restarted it, and is back)
            time.sleep(0.3)
        assert lengths[-1] == 7 and 3 in lengths, lengths
        assert rb.dead_shards == ()
        assert ray_session.get(rb.shards[1].actor.describe.remote())["pid"] != old
        assert set(rb.sample(64)["collector"].tolist()) == {1, 2}
        assert rb.extend(make_batch(3, 0, 1)).tolist() == [3]  # shard 0 in turn
        assert rb.extend(make_batch(3, 1, 1)).tolist() == [14]  # and shard 1 again
    finally:
        rb.shutdown()


def test_a_sample_written_back_is_stored_without_its_bookkeeping(ray_session):
    # the entry check took the sample's index, priority_weight and write_generation for new
    # entries (KeyError), where a local buffer and a RayReplayBuffer leave them out
    rb = ShardedReplayBuffer(num_shards=2, storage=partial(LazyTensorStorage, 10),
                             alpha=1.0, beta=1.0, batch_size=4,
                             replay_buffer_cls=TensorDictPrioritizedReplayBuffer)
    try:
        rb.extend(TensorDict({"id": torch.arange(5)}, [5]))
        rb.extend(TensorDict({"id": torch.arange(100, 105)}, [5]))
        sample = rb.sample()
        assert {"index", "priority_weight"} <= set(sample.keys())
        rb.extend(sample)
        assert len(rb) == 14 and set(rb.sample(64).keys()) >= {"id"}
        stored = torch.cat([s[torch.arange(len(s))]["id"] for s in rb.shards])
        assert sorted(stored.tolist()) == sorted(list(range(5)) + list(range(100, 105))
                                                 + sample["id"].tolist())
    finally:
        rb.close()


def test_close_stops_the_threads_drawing_ahead(ray_session):
    # each closed buffer kept its prefetch threads until collected, and draws still running
    # at close() hit the killed actors (warning to "respawn it")
    import threading
    import warnings

    def drawing_threads() -> int:
        return sum(t.name.startswith("tdreplay-draw-ahead") for t in threading.enumerate())

    before = drawing_threads()
    rb = ShardedReplayBuffer(num_shards=2, storage=partial(LazyTensorStorage, 10),
                             batch_size=2, prefetch=2, replay_buffer_cls=TensorDictReplayBuffer)
    rb.extend(TensorDict({"id": torch.arange(6)}, [6]))
    rb.sample()
    assert drawing_threads() > before
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no draw runs against the killed actors
        rb.close()
        time.sleep(0.5)
    assert drawing_threads() == before
