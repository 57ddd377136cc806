"""Boolean arguments of the remote buffers take a bool (or a numpy bool) and nothing else:
``"yes"``, ``1``, ``"False"`` (truthy in TorchRL) or ``None`` raise a ``TypeError`` naming
the argument in the client, before anything is sent (no batch drawn ahead is dropped, no row
changes). Runs on the session's local Ray instance (conftest.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from distributed_workers import make_batch
from tensordict import TensorDict

from tdreplay.distributed import ShardedReplayBuffer

BAD = ["yes", "False", 1, 0, None]

CALLS: list[tuple[str, Callable[[Any, Any], Any], str]] = [
    ("sample", lambda rb, v: rb.sample(return_info=v), "return_info"),
    ("empty", lambda rb, v: rb.empty(v), "empty_write_count"),
    ("append_transform", lambda rb, v: rb.append_transform(torch.neg, invert=v), "invert"),
    ("insert_transform", lambda rb, v: rb.insert_transform(0, torch.neg, invert=v), "invert"),
    ("update_", lambda rb, v: rb.update_({"obs": torch.zeros(10)}, clone=v), "clone"),
    ("share", lambda rb, v: rb.share(v), "shared"),
    ("update_if_present",
     lambda rb, v: rb.update_if_present(index=torch.arange(2), generation=torch.zeros(2),
                                        patch={"obs": torch.zeros(2)}, require_newer=v),
     "require_newer"),
    ("submit_update_if_present",
     lambda rb, v: rb.submit_update_if_present(index=torch.arange(2), generation=torch.zeros(2),
                                               patch={"obs": torch.zeros(2)}, require_newer=v),
     "require_newer"),
]


@pytest.mark.parametrize("case, call, name", CALLS, ids=[c[0] for c in CALLS])
def test_ray_buffer_refuses_flags_that_are_not_bools(shared_td, case, call, name):
    shared_td.extend(make_batch(0, 0, 10))
    rows = shared_td[:]["obs"].clone()
    for value in BAD:
        with pytest.raises(TypeError, match=f"{name} must be a bool, got"):
            call(shared_td, value)
    assert len(shared_td) == 10 and shared_td.write_count == 10
    assert torch.equal(shared_td[:]["obs"], rows)
    assert bool(torch.isin(shared_td.sample()["obs"], rows).all())  # no transform was added


def test_ray_buffer_takes_numpy_bools(shared_td):
    shared_td.extend(make_batch(0, 0, 10))
    assert isinstance(shared_td.sample(return_info=np.bool_(True)), tuple)
    assert not isinstance(shared_td.sample(return_info=np.bool_(False)), tuple)
    assert shared_td.share(np.bool_(True)) is shared_td
    shared_td.empty(np.bool_(False))
    assert len(shared_td) == 0 and shared_td.write_count == 10


@pytest.fixture
def sharded(prioritized_shards):
    prioritized_shards.empty()
    rb = ShardedReplayBuffer.attach("sharded")
    rb.extend(TensorDict({"x": torch.arange(6.0)}, [6]))
    return rb


SHARDED_CALLS: list[tuple[str, Callable[[Any, Any], Any], str]] = [
    ("sample", lambda rb, v: rb.sample(4, return_info=v), "return_info"),
    ("empty", lambda rb, v: rb.empty(v), "empty_write_count"),
    ("update_if_present",
     lambda rb, v: rb.update_if_present(index=torch.arange(2), generation=torch.zeros(2),
                                        patch={"x": torch.zeros(2)}, require_newer=v),
     "require_newer"),
]


@pytest.mark.parametrize("case, call, name", SHARDED_CALLS, ids=[c[0] for c in SHARDED_CALLS])
def test_sharded_buffer_refuses_flags_that_are_not_bools(sharded, case, call, name):
    for value in BAD:
        with pytest.raises(TypeError, match=f"{name} must be a bool, got"):
            call(sharded, value)
    assert len(sharded) == 6 and sharded.write_count == 6


def test_sharded_buffer_takes_numpy_bools(sharded):
    assert isinstance(sharded.sample(4, return_info=np.bool_(True)), tuple)
    sharded.empty(np.bool_(True))
    assert len(sharded) == 0 and sharded.write_count == 0
