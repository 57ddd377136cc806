"""Differential fault fuzzing of the distributed buffers' recovery and of the ``"distributed"``
transport, against local models.

Seeded random histories of extend / sample / update_priority / checkpoint / crash (the actor's
process SIGKILLed and restarted by Ray from ``checkpoint_path``, or killed and ``respawn``-ed
from the last checkpoint) / reconnect / malformed calls, run against:

* a named :class:`RayReplayBuffer` (prioritized TensorDict buffer) and a local
  ``TensorDictPrioritizedReplayBuffer``, the model restored from its own copy of the same last
  checkpoint when the remote one recovers;
* a 2-shard :class:`ShardedReplayBuffer` and one local buffer per shard (a dead shard is
  respawned from its checkpoint, the live one keeps its newer writes);
* the ``"distributed"`` transport's :class:`DistributedBufferClient` and a local buffer,
  malformed calls included (refused with a clear error, the served buffer unchanged), with
  clients that disconnect (cleanly or by being dropped) mid-history.

After every step: ``len``, ``write_count``, every stored row by slot and the priorities; after a
recovery, exactly the committed (checkpointed) state.

Ray actors take seconds to start on the test machine: the histories share a few actors and only
some of them really kill one (the others recover by ``loads`` of the last checkpoint).
"""

from __future__ import annotations

import gc
import os
import pickle
import signal
import uuid
import warnings
from functools import partial

import pytest
import torch
from distributed_workers import retry_until
from tensordict import TensorDict

from tdreplay.core import ListStorage, ReplayBuffer, TensorDictReplayBuffer
from tdreplay.distributed import (
    BufferActorDiedError,
    DistributedBufferClient,
    RayReplayBuffer,
    RemoteBufferError,
    ShardedReplayBuffer,
    ShardsUnavailableWarning,
)
from tdreplay.distributed._server import seeded_generator
from tdreplay.samplers import TensorDictPrioritizedReplayBuffer
from tdreplay.storages import LazyTensorStorage

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]

N = 8  # slots of the single buffers
SHARD = 6  # slots of each shard
ALPHA, BETA = 1.0, 1.0
SEEDS = list(range(10))
REAL_KILL = {0: "sigkill", 7: "ray_kill"}  # seeds whose crash is a real one


def _td(values) -> TensorDict:
    v = torch.as_tensor(values, dtype=torch.float32)
    return TensorDict({"x": v, "y": torch.stack([v, -v], -1)}, [v.shape[0]])


def _rows(rb) -> dict[int, float]:
    """slot -> x of every stored row."""
    if len(rb) == 0:
        return {}
    data = rb[torch.arange(len(rb))]
    return dict(enumerate(data["x"].tolist()))


def _priorities(rb) -> list[float]:
    return rb.state_dict()["_sampler"]["priorities"][:N].tolist()


def _until(call, accept=(RemoteBufferError,), timeout=40.0):
    return retry_until(call, accept, timeout)


def _local(seed: int) -> TensorDictPrioritizedReplayBuffer:
    return TensorDictPrioritizedReplayBuffer(storage=LazyTensorStorage(N), alpha=ALPHA, beta=BETA,
                                             batch_size=4,
                                             generator=torch.Generator().manual_seed(seed))


def _outcome(fn, rb):
    try:
        return "ok", fn(rb)
    except Exception as err:  # noqa: BLE001 - compared by type
        return "err", err


# ---- one served buffer: crash, restart, respawn ------------------------------------------------
@pytest.fixture(scope="module")
def single(ray_session, tmp_path_factory):
    root = tmp_path_factory.mktemp("single")
    rb = RayReplayBuffer(storage=partial(LazyTensorStorage, N),
                         replay_buffer_cls=TensorDictPrioritizedReplayBuffer, alpha=ALPHA,
                         beta=BETA, batch_size=4, name="diff-recovery-single",
                         remote_config={"max_restarts": -1},
                         checkpoint_path=str(root / "auto"), call_timeout=30.0,
                         start_timeout=60.0)
    yield rb, root
    rb.shutdown()


def _check_same(remote, local, where):
    assert (len(remote), remote.write_count) == (len(local), local.write_count), where
    assert _rows(remote) == _rows(local), where
    assert _priorities(remote) == pytest.approx(_priorities(local), rel=1e-5), where


@pytest.mark.timeout(90)
@pytest.mark.parametrize("seed", SEEDS)
def test_crash_recovery_history_matches_a_local_model(single, tmp_path, seed):
    rb, root = single
    rng = torch.Generator().manual_seed(1000 + seed)
    rb.empty()
    local = _local(seed)
    rb.dumps()  # commit the empty buffer (checkpoint_path)
    local_ckpt = tmp_path / "local-ckpt"
    local.dumps(local_ckpt)
    counter = [0]
    killed = False

    def values(n):
        out = torch.arange(counter[0], counter[0] + n).float() + 0.5
        counter[0] += n
        return out

    def rint(lo, hi):
        return int(torch.randint(lo, hi, (1,), generator=rng))

    for step in range(14):
        op = rint(0, 10)
        where = (seed, step, op)
        if op in (0, 1, 2):  # extend
            d = _td(values(rint(1, 5)))
            slots_l = local.extend(d.clone())
            remote_d = d.clone()
            slots_r = rb.extend(remote_d)
            assert torch.equal(slots_l, slots_r), where
            assert "index" not in remote_d.keys(), where  # the caller's data is left as is
        elif op == 3 and len(local):  # update_priority
            k = rint(1, 4)
            idx = torch.randint(0, len(local), (k,), generator=rng)
            pr = torch.rand(k, generator=rng) * 3
            if rint(0, 3) == 0:
                pr[0] = 0.0  # never drawn again
            local.update_priority(idx, pr)
            rb.update_priority(idx, pr)
        elif op == 4:  # malformed priority update: refused alike, nothing changed
            before = _priorities(rb)
            bad = [(torch.tensor([0, 1]), torch.tensor([1.0, 2.0, 3.0])),  # lengths differ
                   (torch.tensor([0]), torch.tensor([-1.0])),  # negative
                   (torch.tensor([0]), torch.tensor([float("nan")])),
                   (torch.tensor([N + 5]), torch.tensor([1.0]))][rint(0, 4)]
            out_l = _outcome(lambda b, bad=bad: b.update_priority(*bad), local)
            out_r = _outcome(lambda b, bad=bad: b.update_priority(*bad), rb)
            assert out_l[0] == out_r[0], (where, bad, out_l, out_r)
            if out_r[0] == "err":
                assert isinstance(out_r[1], type(out_l[1])), (where, out_l, out_r)
                assert _priorities(rb) == before, where
        elif op in (5, 6) and len(local):  # sample: rows are the stored ones at info["index"]
            bs = rint(1, 6)
            data, info = rb.sample(bs, return_info=True)
            stored = _rows(local)
            assert data.batch_size == torch.Size([bs]), where
            for i, x in zip(info["index"].tolist(), data["x"].tolist()):
                assert stored[i] == x, where
            zero = {i for i, p in enumerate(_priorities(local)) if p == 0.0 and i < len(local)}
            if len(zero) < len(local):
                assert not zero & set(info["index"].tolist()), where
        elif op == 7:  # checkpoint (the commit point)
            rb.dumps()
            local.dumps(local_ckpt)
        elif op == 8:  # crash, then recover: exactly the last checkpoint is back
            if seed in REAL_KILL and not killed:
                killed = True
                if REAL_KILL[seed] == "sigkill":  # Ray restarts it from checkpoint_path
                    pid = rb.actor_info["pid"]
                    os.kill(pid, signal.SIGKILL)

                    def restarted(pid=pid):
                        rb.reconnect()
                        assert rb.actor_info["pid"] != pid

                    _until(restarted, accept=(RemoteBufferError, AssertionError))
                else:  # killed for good: the creator respawns it from the checkpoint
                    ray_kill = __import__("ray").kill
                    ray_kill(rb.actor, no_restart=True)

                    def gone():
                        try:
                            len(rb)
                        except BufferActorDiedError:
                            return
                        raise TimeoutError  # ray.kill is asynchronous: not dead yet

                    _until(gone, accept=(TimeoutError,), timeout=20)
                    rb.respawn(root / "auto")
            else:
                rb.loads(root / "auto")  # a recovery without the kill
            local.loads(local_ckpt)
        elif op == 9:  # another client reconnects and sees the same buffer
            other = RayReplayBuffer.attach("diff-recovery-single")
            other.reconnect()
            _check_same(other, local, where)
        else:
            continue
        _check_same(rb, local, where)


# ---- a sharded buffer: one shard dies, is respawned from its checkpoint ------------------------
@pytest.mark.timeout(120)
def test_sharded_history_with_a_dead_shard_matches_per_shard_models(ray_session, tmp_path):
    rng = torch.Generator().manual_seed(77)
    rb = ShardedReplayBuffer(num_shards=2, storage=partial(LazyTensorStorage, SHARD),
                             replay_buffer_cls=TensorDictReplayBuffer, batch_size=5,
                             generator=torch.Generator().manual_seed(0), call_timeout=30.0,
                             start_timeout=60.0)
    models = [TensorDictReplayBuffer(storage=LazyTensorStorage(SHARD)) for _ in range(2)]
    ckpt = tmp_path / "sharded"
    local_ckpts = [tmp_path / f"model-{k}" for k in range(2)]
    dead: set[int] = set()
    cursor = [0]
    counter = [0]
    killed = False

    def next_shard():  # the round-robin over live shards that ShardedReplayBuffer documents
        live = [k for k in range(2) if k not in dead]
        shard = min((k for k in live if k >= cursor[0] % 2), default=live[0])
        cursor[0] = shard + 1
        return shard

    def check(where):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ShardsUnavailableWarning)
            live = [k for k in range(2) if k not in dead]
            assert len(rb) == sum(len(models[k]) for k in live), where
            assert rb.write_count == sum(models[k].write_count for k in live), where
            for k in live:
                assert _rows(rb.shards[k]) == _rows(models[k]), (where, k)
                assert rb.shards[k].write_count == models[k].write_count, (where, k)

    try:
        rb.dumps(ckpt)
        for k in range(2):
            models[k].dumps(local_ckpts[k])
        for step in range(24):
            op = int(torch.randint(0, 8, (1,), generator=rng))
            where = (step, op, sorted(dead))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ShardsUnavailableWarning)
                if op in (0, 1, 2):
                    n = int(torch.randint(1, 4, (1,), generator=rng))
                    vals = torch.arange(counter[0], counter[0] + n).float() + 0.5
                    counter[0] += n
                    k = next_shard()
                    slots = rb.extend(_td(vals))
                    assert torch.equal(slots, models[k].extend(_td(vals)) + k * SHARD), where
                elif op == 3 and len(rb):
                    data, info = rb.sample(return_info=True)
                    for g, x in zip(info["index"].tolist(), data["x"].tolist()):
                        k = g // SHARD
                        assert k not in dead and _rows(models[k])[g % SHARD] == x, where
                elif op == 4 and dead:  # no checkpoint of a dead shard: refused, none written
                    with pytest.raises(BufferActorDiedError, match="dumps.*respawn"):
                        rb.dumps(tmp_path / "refused")
                    assert not os.path.exists(tmp_path / "refused" / "sharded.json"), where
                elif op == 4:  # commit
                    rb.dumps(ckpt)
                    for k in range(2):
                        models[k].dumps(local_ckpts[k])
                elif op == 5 and not dead and not killed:  # shard 1 dies
                    killed = True
                    __import__("ray").kill(rb.shards[1].actor, no_restart=True)

                    def gone():
                        try:
                            rb.shards[1].write_count  # noqa: B018
                        except BufferActorDiedError:
                            return
                        raise TimeoutError

                    _until(gone, accept=(TimeoutError,))
                    len(rb)  # the buffer learns it is dead
                    dead.add(1)
                    assert rb.dead_shards == (1,), where
                elif op == 6 and dead:  # respawn only the dead shard from the checkpoint
                    rb.respawn(ckpt)
                    for k in dead:
                        models[k].loads(local_ckpts[k])
                    dead.clear()
                    assert rb.dead_shards == (), where
                elif op == 7 and not dead:  # every shard back to the checkpoint
                    rb.loads(ckpt)
                    for k in range(2):
                        models[k].loads(local_ckpts[k])
                else:
                    continue
            check(where)
        assert killed, "the history never killed a shard"
    finally:
        rb.shutdown()


# ---- the "distributed" transport: a client over its own channel --------------------------------
@pytest.fixture(scope="module")
def served(ray_session):
    # named: other clients find a respawned actor by its name (reconnect)
    rb = RayReplayBuffer(name=f"served-{uuid.uuid4().hex[:8]}", storage=partial(LazyTensorStorage, N),
                         replay_buffer_cls=TensorDictPrioritizedReplayBuffer, alpha=ALPHA,
                         beta=BETA, batch_size=4, transport="distributed",
                         transport_options={"timeout": 20.0}, call_timeout=30.0,
                         generator=partial(seeded_generator, 0))
    yield rb
    rb.close()


def _bad_priority(rng, sample):
    kind = int(torch.randint(0, 5, (1,), generator=rng))
    td = sample.select("index")
    if kind == 0:
        td["td_error"] = torch.full(td.shape, -1.0)
    elif kind == 1:
        td["td_error"] = torch.full(td.shape, float("nan"))
    elif kind == 2:
        td["td_error"] = torch.ones(td.shape)
        td["index"] = torch.full(td.shape, N + 3)
    elif kind == 3:
        td["td_error"] = torch.ones(td.shape)
        del td["index"]
    else:
        td = torch.ones(3)  # not a TensorDict
    return kind, td


@pytest.mark.timeout(60)
@pytest.mark.parametrize("seed", range(4))
def test_distributed_transport_client_history_matches_a_local_buffer(served, seed):
    rng = torch.Generator().manual_seed(500 + seed)
    served.empty()
    local = _local(seed)
    client = served.client()
    assert isinstance(client, DistributedBufferClient)
    counter = [0]
    last_sample = None

    def check(where):
        assert (len(client), client.write_count) == (len(local), local.write_count), where
        assert (len(served), served.write_count) == (len(local), local.write_count), where
        assert _rows(served) == _rows(local), where
        assert _priorities(served) == pytest.approx(_priorities(local), rel=1e-5), where

    for step in range(16):
        op = int(torch.randint(0, 9, (1,), generator=rng))
        where = (seed, step, op)
        if op in (0, 1, 2):
            vals = torch.arange(counter[0], counter[0] + 3).float() + 0.5  # fixed layout
            counter[0] += 3
            slots = client.extend(_td(vals))
            assert torch.equal(slots, local.extend(_td(vals))), where
        elif op in (3, 4) and len(local):
            sample = client.sample()
            assert sample.batch_size == torch.Size([4]), where
            stored = _rows(local)
            for i, x in zip(sample["index"].tolist(), sample["x"].tolist()):
                assert stored[i] == x, where
            last_sample = sample
        elif op == 5 and last_sample is not None:
            # index and priority only: the served buffer's write generations (its clock runs
            # on over the earlier histories) are not the fresh model's
            td = last_sample.select("index")
            td["td_error"] = torch.rand(td.shape, generator=rng) * 2 + 0.1
            client.update_tensordict_priority(td)
            local.update_tensordict_priority(td.clone())
        elif op == 6 and last_sample is not None:  # malformed: refused, nothing changed
            kind, bad = _bad_priority(rng, last_sample)
            before = _priorities(served)
            out_l = _outcome(lambda b, bad=bad: b.update_tensordict_priority(bad), local)
            out_c = _outcome(lambda b, bad=bad: b.update_tensordict_priority(bad), client)
            assert out_c[0] == out_l[0] == "err", (where, kind, out_l, out_c)
            assert isinstance(out_c[1], type(out_l[1])), (where, kind, out_l, out_c)
            assert _priorities(served) == before, (where, kind)
        elif op == 7:  # malformed writes: refused before anything is sent
            bad = [TensorDict({"x": torch.ones(2)}, [2]), _td(torch.ones(5)),
                   torch.ones(3)][int(torch.randint(0, 3, (1,), generator=rng))]
            count = served.write_count
            if client._extend_layout is None:  # noqa: SLF001 - no layout yet: a first extend
                continue
            with pytest.raises((TypeError, ValueError), match="layout|TensorDict"):
                client.extend(bad)
            assert served.write_count == count, where
        elif op == 8:  # the client leaves mid-history (cleanly or dropped), a new one goes on
            if int(torch.randint(0, 2, (1,), generator=rng)):
                client.disconnect()
            else:
                copy = pickle.loads(pickle.dumps(client))
                assert len(copy) == len(local)
                del copy
                gc.collect()
            client = served.client() if int(torch.randint(0, 2, (1,), generator=rng)) \
                else client
        else:
            continue
        check(where)


@pytest.mark.timeout(60)
def test_a_malformed_sample_through_the_client_is_refused_and_changes_nothing(served):
    served.empty()
    client = served.client()
    client.extend(_td(torch.arange(4.0)))
    for bad, err in ((0, (ValueError, RuntimeError)), (-2, (ValueError, RuntimeError))):
        with pytest.raises(err, match="batch_size|batch size"):
            client.sample(bad)
    assert client.sample().batch_size == torch.Size([4])  # the layout was not fixed by them
    assert len(client) == 4 and client.write_count == 4


@pytest.mark.timeout(60)
def test_a_distributed_client_goes_on_after_the_served_buffer_is_respawned(served, tmp_path):
    served.empty()
    client = served.client()
    client.extend(_td(torch.arange(3.0)))
    served.dumps(tmp_path / "ckpt")
    served.respawn(tmp_path / "ckpt")
    assert len(served) == 3

    def length():
        if hasattr(client, "reconnect"):
            client.reconnect()
        return len(client)

    # the first call may find its old channel closed; the next must reach the new actor
    assert _until(length, accept=(RemoteBufferError, ConnectionError, RuntimeError),
                  timeout=2) == 3


# ---- refused calls of a sharded buffer with a dead shard: nothing changed ----------------------
@pytest.fixture(scope="module")
def half_dead(ray_session, tmp_path_factory):
    """A 2-shard buffer, both shards committed with 2 rows at ``ckpt``, then shard 1 killed."""
    ckpt = tmp_path_factory.mktemp("half-dead") / "ckpt"
    rb = ShardedReplayBuffer(num_shards=2, storage=partial(LazyTensorStorage, SHARD),
                             replay_buffer_cls=TensorDictReplayBuffer, batch_size=2,
                             call_timeout=30.0, start_timeout=60.0)
    rb.extend(_td([0.5, 1.5]))
    rb.extend(_td([2.5, 3.5]))
    rb.dumps(ckpt)
    __import__("ray").kill(rb.shards[1].actor, no_restart=True)

    def dead():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ShardsUnavailableWarning)
            len(rb)  # the buffer learns that shard 1 is dead
        if rb.dead_shards != (1,):
            raise TimeoutError

    _until(dead, accept=(TimeoutError,))
    yield rb, ckpt
    rb.shutdown()


def _fresh_rows_on_shard_0(rb) -> dict[int, float]:
    shard = rb.shards[0]
    shard.empty()
    shard.extend(_td([10.5, 11.5, 12.5]))  # newer than the checkpoint: not committed to it
    return _rows(shard)


@pytest.mark.timeout(60)
def test_sharded_loads_refused_for_a_dead_shard_changes_no_live_shard(half_dead):
    rb, ckpt = half_dead
    rows = _fresh_rows_on_shard_0(rb)
    with pytest.raises(BufferActorDiedError, match="loads"):
        rb.loads(ckpt)
    assert _rows(rb.shards[0]) == rows and rb.shards[0].write_count == 3


@pytest.mark.timeout(60)
def test_sharded_empty_refused_for_a_dead_shard_changes_no_live_shard(half_dead):
    rb, _ = half_dead
    rows = _fresh_rows_on_shard_0(rb)
    with pytest.raises(BufferActorDiedError, match="empty"):
        rb.empty()
    assert _rows(rb.shards[0]) == rows and rb.shards[0].write_count == 3


@pytest.mark.timeout(60)
def test_sharded_dumps_refused_for_a_dead_shard_keeps_the_committed_checkpoint(half_dead):
    rb, ckpt = half_dead
    _fresh_rows_on_shard_0(rb)
    with pytest.raises(BufferActorDiedError, match="dumps"):
        rb.dumps(ckpt)
    committed = TensorDictReplayBuffer(storage=LazyTensorStorage(SHARD))
    committed.loads(ckpt / "shard-0")
    assert _rows(committed) == {0: 0.5, 1: 1.5}


# ---- respawn from a checkpoint that is not there (last: it may leave "single" dead) ------------
@pytest.mark.timeout(60)
def test_respawn_from_a_missing_checkpoint_keeps_the_live_buffer(single, tmp_path):
    rb, _ = single
    rb.empty()
    rb.extend(_td([0.5, 1.5, 2.5]))
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        rb.respawn(tmp_path / "missing")
    assert len(rb) == 3 and _rows(rb) == {0: 0.5, 1: 1.5, 2: 2.5}


@pytest.mark.timeout(120)
def test_calls_after_a_failed_respawn_say_the_actor_is_gone(single, tmp_path):
    rb, _ = single
    rb.dumps()  # to checkpoint_path, which respawn() restores
    saved = len(rb)
    # a whole checkpoint, of another kind of buffer: it passes the check, the new actor
    # refuses it (the old one is gone by then)
    other = ReplayBuffer(storage=ListStorage(N))
    other.extend([1, 2])
    other.dumps(tmp_path / "other")
    with pytest.raises(Exception, match="ListStorage"):
        rb.respawn(tmp_path / "other")
    for call in (lambda: len(rb), lambda: rb.extend(_td([1.0])), lambda: rb.dumps(tmp_path / "c")):
        with pytest.raises(BufferActorDiedError, match="respawn"):
            call()
    rb.respawn()  # a new actor, restored from checkpoint_path, serves again
    assert len(rb) == saved
