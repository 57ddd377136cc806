"""A sharded buffer refuses a batch bound for a shard whose lazy storage is not laid out yet
as a local buffer refuses it: the shard is first laid out like the written shards (no rows),
and its storage checks the batch; no row is written anywhere;
a closed sharded buffer refuses every call with one clear error; ``sample`` checks its
batch size as a local buffer does. Runs on the session's local Ray instance (conftest.py)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial

import pytest
import torch
from distributed_workers import SchemaWriter, schema_batch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.distributed import BufferActorDiedError, ShardedReplayBuffer
from tdreplay.samplers import TensorDictPrioritizedReplayBuffer
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage

GOOD = TensorDict({"obs": torch.randn(10, 3), "act": torch.arange(10),
                   "nested": {"x": torch.zeros(10, 2)}}, [10])

#: name -> a batch that differs from GOOD's layout
BAD = {
    "missing key": GOOD.exclude("act"),
    "missing nested key": GOOD.exclude(("nested", "x")),
    "other shape": GOOD.clone().set("obs", torch.zeros(10, 4)),
    "lossy dtype": GOOD.clone().set("act", torch.arange(10).double() + 0.5),
    "extra key": GOOD.clone().set("extra", torch.zeros(10)),
    "another layout": TensorDict({"obs": torch.randn(10, 7)}, [10]),
}


def outcome(call):
    try:
        return ("ok", call())
    except Exception as err:  # noqa: BLE001 - compared below
        return (type(err), str(err))


def same(a, b) -> bool:
    """Whether two states (nested dicts, lists, tensors) are equal."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor) or hasattr(a, "batch_size"):
        return bool((a == b).all()) if a.shape == b.shape else False
    return a == b


def shard_state(rb: ShardedReplayBuffer):
    """The rows and counts of every shard (a shard laid out by a refused batch holds none)."""
    return ([len(s) for s in rb.shards], [s.write_count for s in rb.shards],
            [s[:len(s)] if len(s) else None for s in rb.shards])


@pytest.fixture(params=[LazyTensorStorage, LazyMemmapStorage], ids=["tensor", "memmap"])
def storage_cls(request):
    return request.param


@contextmanager
def sharded(num_shards: int, storage, **kwargs) -> Iterator[ShardedReplayBuffer]:
    """A sharded ``TensorDictReplayBuffer`` of ``num_shards`` shards of ``storage``, closed
    when the block ends."""
    rb = ShardedReplayBuffer(num_shards=num_shards, storage=storage,
                             replay_buffer_cls=TensorDictReplayBuffer, **kwargs)
    try:
        yield rb
    finally:
        rb.close()


def test_batch_for_an_unwritten_shard_is_refused_as_by_a_local_buffer(ray_session, storage_cls):
    local = TensorDictReplayBuffer(storage=storage_cls(50), batch_size=8)
    local.extend(GOOD)
    with sharded(2, partial(storage_cls, 50), batch_size=8,
                 write_strategy="least_written") as rb:
        assert rb.extend(GOOD)[:2].tolist() == [0, 1]  # shard 0 is laid out, shard 1 not
        for name, bad in BAD.items():
            before = shard_state(rb)
            got = outcome(lambda bad=bad: rb.extend(bad))
            if name == "extra key":  # (a local LazyTensorStorage adds it: shards must not)
                assert got[0] is KeyError and "unexpected ['extra']" in got[1], got
            else:
                assert got == outcome(lambda bad=bad: local.extend(bad)), name
            assert issubclass(got[0], (KeyError, ValueError, TypeError)), name
            assert same(before, shard_state(rb)), name  # no row written anywhere
            # shard 1 is laid out like shard 0 now, with no rows
            assert rb.shards[1].state_dict()["_storage"]["initialized"] is True
        # the add path refuses as well
        got = outcome(lambda: rb.add(GOOD[0].exclude("act")))
        assert got == outcome(lambda: local.add(GOOD[0].exclude("act")))
        assert len(rb.shards[1]) == 0
        # good batches go on: shard 1 is written now, and samples join both shards
        assert rb.extend(GOOD)[:2].tolist() == [50, 51]
        assert rb.extend(GOOD.clone().set("act", torch.arange(10, 20)))[0] in (10, 60)
        sample = rb.sample(64)
        assert sample["act"].dtype is torch.int64
        assert set(sample.keys(True, True)) == {*GOOD.keys(True, True), "index"}
        assert len(rb) == 30 and rb.write_count == 30


def test_float_batch_on_an_unwritten_shard_does_not_cast_later_int_batches(ray_session):
    with sharded(2, partial(LazyTensorStorage, 50), batch_size=8,
                 write_strategy="least_written") as rb:
        rb.extend(GOOD)                                      # shard 0
        with pytest.raises(TypeError, match="would lose the fractional part"):
            rb.extend(BAD["lossy dtype"])                    # for shard 1: refused
        # a lossless cast is taken, and shard 1 is laid out with shard 0's dtypes
        narrow = GOOD.clone().set("act", torch.arange(10, dtype=torch.int32))
        assert rb.extend(narrow)[0] == 50
        assert rb.extend(GOOD)[0] == 10
        assert [len(s) for s in rb.shards] == [20, 10]
        assert all(s.state_dict()["_storage"]["storage"]["act"].dtype is torch.int64
                   for s in rb.shards)
        assert rb.sample(64)["act"].dtype is torch.int64


def test_first_write_with_no_shard_laid_out_lays_out_the_lowest_shard(ray_session):
    with sharded(3, partial(LazyTensorStorage, 10), batch_size=4) as rb:
        rb._cursor = 2  # a client whose first write is bound for shard 2
        assert rb.extend(schema_batch("a", 2)).tolist() == [0, 1]  # went to shard 0
        assert rb.extend(schema_batch("a", 2)).tolist() == [2, 3]  # shard 0 in turn
        with pytest.raises(KeyError, match=r"missing \['act'\], unexpected \['rew'\]"):
            rb.extend(schema_batch("b", 2))                # for shard 1: checked
        assert [len(s) for s in rb.shards] == [4, 0, 0]


def test_once_every_shard_is_laid_out_writes_read_no_layout(ray_session):
    rb = ShardedReplayBuffer(num_shards=2, storage=partial(LazyTensorStorage, 50),
                             batch_size=8, replay_buffer_cls=TensorDictReplayBuffer)
    try:
        rb.extend(GOOD)
        rb.extend(GOOD)
        assert rb._calls.laid_out == {0, 1}

        def no_round(*args, **kwargs):
            raise AssertionError("a layout was read")

        rb._calls.tolerant = no_round  # writes now call their shard only
        assert rb.extend(GOOD)[0] == 10  # shard 0 in turn
        with pytest.raises(KeyError, match="data keys do not match"):  # the storage's own
            rb.extend(BAD["missing key"])
    finally:
        del rb._calls.tolerant
        rb.close()


def three_shards_two_handles() -> tuple[ShardedReplayBuffer, list]:
    """A buffer of 3 empty shards, and two client handles whose first writes are bound for
    shards 1 and 2."""
    rb = ShardedReplayBuffer(num_shards=3, storage=partial(LazyTensorStorage, 30),
                             batch_size=8, replay_buffer_cls=TensorDictReplayBuffer)
    handles = []
    for first in (1, 2):
        rb._cursor = first
        handles.append(rb.client())
    return rb, handles


def test_writers_in_actors_racing_to_empty_shards_lay_them_out_alike(ray_session):
    rb, handles = three_shards_two_handles()
    try:
        actors = [ray_session.remote(num_cpus=0)(SchemaWriter).remote() for _ in range(2)]
        ray_session.get([actor.__ray_ready__.remote() for actor in actors], timeout=120)
        refs = [actor.write.remote(handle, schema, 3, 4)
                for actor, handle, schema in zip(actors, handles, "ab")]
        results = ray_session.get(refs, timeout=120)
        kinds = [{kind for kind, _ in result} for result in results]
        # one layout won (whichever write reached the lowest shard first); every write of
        # the other was refused with the storages' KeyError, whatever shard it was bound for
        assert sorted(map(sorted, kinds)) == [["KeyError"], ["ok"]], results
        winner = kinds.index({"ok"})
        keys = [set(s.state_dict()["_storage"]["storage"].keys(True, True))
                for s in rb.shards if len(s)]
        assert all(k == set(schema_batch("ab"[winner], 1).keys(True, True)) for k in keys)
        assert len(rb) == 12 and rb.sample(16).batch_size == torch.Size([16])
        for actor in actors:
            ray_session.kill(actor)
    finally:
        rb.close()


def test_two_handles_first_writes_to_two_empty_shards_are_checked_alike(ray_session):
    rb, handles = three_shards_two_handles()
    try:
        assert handles[0].extend(schema_batch("a", 4)).tolist() == [0, 1, 2, 3]  # shard 0
        before = shard_state(rb)
        with pytest.raises(KeyError, match=r"missing \['act'\], unexpected \['rew'\]"):
            handles[1].extend(schema_batch("b", 4))  # bound for shard 2: checked
        assert same(before, shard_state(rb))
        assert [len(s) for s in rb.shards] == [4, 0, 0]
        assert handles[1].extend(schema_batch("a", 4)).tolist() == [4, 5, 6, 7]  # in turn
    finally:
        rb.close()


def test_every_call_after_close_raises_that_the_buffer_was_closed(ray_session):
    rb = ShardedReplayBuffer(num_shards=2, storage=partial(LazyTensorStorage, 50),
                             replay_buffer_cls=TensorDictPrioritizedReplayBuffer,
                             alpha=1.0, beta=1.0, batch_size=4)
    rb.extend(TensorDict({"x": torch.arange(10.0)}, [10]))
    sample = rb.sample()
    sample["td_error"] = torch.ones(4)
    rb.close()
    calls = {
        "extend": lambda: rb.extend(TensorDict({"x": torch.arange(3.0)}, [3])),
        "add": lambda: rb.add(TensorDict({"x": torch.tensor(1.0)}, [])),
        "update_priority": lambda: rb.update_priority(sample["index"], torch.ones(4)),
        "update_tensordict_priority": lambda: rb.update_tensordict_priority(sample),
        "sample": rb.sample,
        "len": lambda: len(rb),
        "write_count": lambda: rb.write_count,
        "state_dict": rb.state_dict,
        "empty": rb.empty,
        "stats": rb.stats,
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no ShardsUnavailableWarning
        for _ in range(2):  # the first extend no longer sets shards aside
            for name, call in calls.items():
                with pytest.raises(BufferActorDiedError, match="was closed") as info:
                    call()
                assert "respawn(path)" not in str(info.value), name
    assert rb.dead_shards == ()


def test_sample_batch_size_is_checked_as_by_a_local_buffer(ray_session):
    local = TensorDictReplayBuffer(storage=LazyTensorStorage(10))
    local.extend(GOOD)
    with sharded(2, partial(LazyTensorStorage, 10)) as rb:
        rb.extend(GOOD)
        for batch_size in (1.5, "3", True, 0, -1, torch.tensor(2)):
            got = outcome(lambda b=batch_size: rb.sample(b))
            assert got == outcome(lambda b=batch_size: local.sample(b)), batch_size
            assert got[0] in (TypeError, ValueError)
