"""``STATE_ATTRS`` names every attribute a trajectory index has: a failed sync puts back exactly
those (read by name, never through ``__dict__``), so a missing name would leave an attribute of
the failed sync behind."""

from __future__ import annotations

import pickle

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.samplers import SliceSampler
from tdreplay.samplers._trajectory_index import STATE_ATTRS
from tdreplay.storages import LazyTensorStorage


def _steps(first: int, count: int, envs: int = 0) -> TensorDict:
    obs = torch.arange(first, first + count)
    if envs:
        obs = obs.reshape(envs, -1)
    done = (obs % 7 == 6).unsqueeze(-1)
    return TensorDict({"obs": obs, ("next", "done"): done}, obs.shape)


def _indexes(rb: TensorDictReplayBuffer) -> list:
    return [rb.sampler._index, rb.sampler._index.scratch(rb.storage)]


@pytest.mark.parametrize("layout", ["flat", "ring", "time_major", "static"])
def test_every_attribute_of_an_index_is_named(layout: str) -> None:
    if layout == "time_major":
        storage = LazyTensorStorage(40, ndim=2)
    else:
        storage = LazyTensorStorage(30 if layout == "ring" else 200)
    sampler = SliceSampler(slice_len=3, end_key=("next", "done"),
                           cache_values=layout == "static", strict_length=False)
    rb = TensorDictReplayBuffer(storage=storage, sampler=sampler, batch_size=12)
    seen: set[str] = set()
    for i in range(6):
        rb.extend(_steps(20 * i, 20, envs=2 if layout == "time_major" else 0))
        rb.sample()
        if layout != "time_major":  # a step rewritten past the buffer
            rb.storage.set(torch.tensor([1]), rb[1:2], set_cursor=False)
            rb.mark_update(torch.tensor([1]))
            rb.sample()
        for index in _indexes(rb):
            seen |= set(vars(index))
    state = rb.state_dict()
    rb.load_state_dict(state)
    rb.sample()
    copy = pickle.loads(pickle.dumps(rb))
    copy.sample()
    seen |= set(vars(rb.sampler._index)) | set(vars(copy.sampler._index))
    assert seen <= set(STATE_ATTRS), sorted(seen - set(STATE_ATTRS))
