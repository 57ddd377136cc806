"""An ensemble that lists one buffer at two positions restores only a state saved from one
buffer at those positions: a checkpoint of two different buffers loaded into it kept the
second buffer's rows in the one buffer and lost the first's, without an error."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import CheckpointError, TensorDictReplayBuffer
from tdreplay.ensembles import ReplayBufferEnsemble
from tdreplay.ensembles._repeated_members import same_state
from tdreplay.storages import LazyTensorStorage


def _buffer(*values: float) -> TensorDictReplayBuffer:
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8))
    if values:
        rb.extend(TensorDict(obs=torch.tensor(values), batch_size=[len(values)]))
    return rb


def _listed_twice() -> tuple[ReplayBufferEnsemble, TensorDictReplayBuffer]:
    one = _buffer(7.0)
    return ReplayBufferEnsemble(one, one, batch_size=2), one


def test_a_state_of_two_buffers_is_refused_and_changes_nothing(tmp_path):
    saved = ReplayBufferEnsemble(_buffer(1.0, 2.0), _buffer(10.0), batch_size=2)
    ensemble, one = _listed_twice()
    with pytest.raises(ValueError, match="members 0 and 1 are one object"):
        ensemble.load_state_dict(saved.state_dict())
    assert one[:]["obs"].tolist() == [7.0]
    saved.dumps(tmp_path / "two")
    with pytest.raises(CheckpointError, match="members 0 and 1 are one object"):
        ensemble.loads(tmp_path / "two")
    assert one[:]["obs"].tolist() == [7.0]


def test_a_state_saved_from_one_buffer_listed_twice_round_trips(tmp_path):
    ensemble, one = _listed_twice()
    one.extend(TensorDict(obs=torch.tensor([8.0]), batch_size=[1]))
    state = ensemble.state_dict()
    ensemble.dumps(tmp_path / "twice")
    restored, other = _listed_twice()
    restored.load_state_dict(state)
    assert other[:]["obs"].tolist() == [7.0, 8.0]
    again, third = _listed_twice()
    again.loads(tmp_path / "twice")
    assert third[:]["obs"].tolist() == [7.0, 8.0]
    # into distinct buffers: each gets the one state
    a, b = _buffer(), _buffer()
    ReplayBufferEnsemble(a, b, batch_size=2).loads(tmp_path / "twice")
    assert a[:]["obs"].tolist() == b[:]["obs"].tolist() == [7.0, 8.0]


def test_same_state_compares_values_exactly():
    assert same_state({"a": [torch.ones(2), 3]}, {"a": [torch.ones(2), 3]})
    assert not same_state({"a": [torch.ones(2), 3]}, {"a": [torch.ones(2), 4]})
    assert not same_state(torch.ones(2), torch.ones(3))
    assert not same_state({"a": 1}, {"b": 1})
    assert same_state(TensorDict(x=torch.ones(2), batch_size=[2]),
                      TensorDict(x=torch.ones(2), batch_size=[2]))
