"""Rate limiters inside buffer actors: calls wait in the actor, up to the call timeout."""

from __future__ import annotations

import threading
import time
from functools import partial

import pytest
import torch
from distributed_workers import make_batch

from tdreplay.core import (
    ListStorage,
    MinSize,
    RateLimitTimeout,
    SampleToInsertRatio,
    TensorDictReplayBuffer,
)
from tdreplay.distributed import RayReplayBuffer, ShardedReplayBuffer


@pytest.fixture(scope="module")
def _min_size_rb(ray_session):
    rb = RayReplayBuffer(storage=partial(ListStorage, 100),
                         replay_buffer_cls=TensorDictReplayBuffer, batch_size=4,
                         rate_limiter=MinSize(6), call_timeout=1.0)
    yield rb, rb.state_dict()
    rb.shutdown()


@pytest.fixture
def min_size_rb(_min_size_rb):
    """The module's MinSize(6) buffer actor, back to its first state (limiter counts too)."""
    rb, fresh = _min_size_rb
    rb.call_timeout = 1.0
    rb.load_state_dict(fresh)
    assert rb.state_dict()["_rate_limiter"] == {"class": "MinSize", "inserts": 0, "samples": 0}
    return rb


def test_sample_waits_in_the_actor_and_times_out_before_the_call(min_size_rb):
    min_size_rb.extend(make_batch(0, 0, 3))
    start = time.monotonic()
    with pytest.raises(RateLimitTimeout, match="sampling 4 items within 0.9 s") as err:
        min_size_rb.sample()
    assert isinstance(err.value, TimeoutError) and err.value.operation == "sample"
    assert 0.8 < time.monotonic() - start < 5
    assert len(min_size_rb) == 3  # the actor is fine and answers


def test_a_blocked_sample_lets_writes_through_and_returns_once_allowed(min_size_rb):
    min_size_rb.call_timeout = 60.0
    out = {}
    thread = threading.Thread(target=lambda: out.setdefault("batch", min_size_rb.sample()))
    thread.start()
    time.sleep(0.5)
    assert "batch" not in out
    min_size_rb.extend(make_batch(0, 0, 6))  # goes through while the sample waits
    thread.join(60)
    assert out["batch"].batch_size == torch.Size([4])
    state = min_size_rb.state_dict()["_rate_limiter"]
    assert state == {"class": "MinSize", "inserts": 6, "samples": 4}


def test_non_blocking_ratio_refuses_inserts_that_run_ahead(ray_session, tmp_path):
    rb = RayReplayBuffer(storage=partial(ListStorage, 100), batch_size=2,
                         rate_limiter=SampleToInsertRatio(1.0, 2, (0.0, 4.0), timeout=0))
    try:
        rb.extend([1, 2, 3, 4])
        with pytest.raises(RateLimitTimeout, match="inserting 1 items .non-blocking"):
            rb.add(5)
        assert len(rb) == 4  # nothing written
        rb.sample()
        assert rb.add(5) == 4
        rb.dumps(tmp_path / "ckpt")
        rb.sample()
        rb.extend([6, 7])
        rb.loads(tmp_path / "ckpt")  # the counts come back with the checkpoint
        assert rb.state_dict()["_rate_limiter"]["inserts"] == 5
        assert rb.state_dict()["_rate_limiter"]["samples"] == 2
    finally:
        rb.shutdown()


def test_sharded_buffers_refuse_a_rate_limiter(ray_session):
    with pytest.raises(TypeError, match="rate_limiter is not supported on sharded"):
        ShardedReplayBuffer(num_shards=2, rate_limiter=MinSize(2))
