"""A buffer state whose sampler holds priorities for slots past the rows of its storage state
(parts of two buffers' states put together) loaded, and then every sample raised
``IndexError`` (the sampler drew slots the storage lacked). It is refused before anything
changes, as a writer cursor past the rows is."""

from __future__ import annotations

import copy

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.samplers import PrioritizedSampler
from tdreplay.storages import LazyTensorStorage


def _buffer() -> TensorDictReplayBuffer:
    return TensorDictReplayBuffer(storage=LazyTensorStorage(8),
                                  sampler=PrioritizedSampler(8, 1.0, 1.0), batch_size=4)


def _filled(ids: range) -> TensorDictReplayBuffer:
    rb = _buffer()
    rb.extend(TensorDict({"id": torch.tensor(list(ids))}, [len(ids)]))
    return rb


def _mixed() -> dict:
    six, three = _filled(range(6)), _filled(range(100, 103))
    six.update_priority(torch.arange(6), torch.tensor([1.0, 1, 1, 1, 1, 50]))
    state = copy.deepcopy(six.state_dict())
    for part in ("_storage", "_writer", "_last_written_row"):
        state[part] = copy.deepcopy(three.state_dict()[part])
    return state


def test_a_sampler_state_past_the_storage_rows_is_refused_and_nothing_changes():
    rb = _filled(range(200, 204))
    before = (rb[:]["id"].tolist(), rb.sampler.state_dict()["priorities"].clone())
    with pytest.raises(ValueError, match=r"state_dict\['_sampler'\]: .*slots \[3, 4, 5\]"):
        rb.load_state_dict(_mixed())
    assert rb[:]["id"].tolist() == before[0]
    assert torch.equal(rb.sampler.state_dict()["priorities"], before[1])
    assert set(rb.sample()["id"].tolist()) <= {200, 201, 202, 203}


def test_a_sampler_state_within_the_storage_rows_loads():
    state = _mixed()
    state["_sampler"] = copy.deepcopy(_filled(range(100, 103)).state_dict()["_sampler"])
    rb = _buffer()
    rb.load_state_dict(state)
    assert set(rb.sample()["id"].tolist()) <= {100, 101, 102}

