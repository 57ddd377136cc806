"""The transforms with state (ObservationNorm, VecNorm, RewardScaling) travel with the
buffer's state_dict / dumps, checked before anything changes."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import CheckpointError, TensorDictReplayBuffer
from tdreplay.storages import LazyTensorStorage
from tdreplay.transforms import ObservationNorm, RewardScaling, VecNorm


def _data(n=8):
    return TensorDict({"obs": torch.randn(n, 3) * 4 + 1, "reward": torch.randn(n, 1)}, [n])


def _rb(*transforms):
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(16), batch_size=4)
    for t in transforms:
        rb.append_transform(t)
    return rb


def test_has_state_declared():
    assert ObservationNorm.has_state and VecNorm.has_state and RewardScaling.has_state


def test_state_dict_carries_and_restores_the_stats():
    data = _data()
    norm = ObservationNorm(in_keys=["obs"])
    norm.init_stats_from(data)
    vec = VecNorm(in_keys=["obs"], decay=0.5)
    rb = _rb(norm, vec, RewardScaling(1.0, 3.0))
    rb.extend(data)
    rb.sample()
    state = rb.state_dict()
    assert set(state["_transform"]) == {"0:ObservationNorm", "1:VecNorm", "2:RewardScaling"}
    fresh = _rb(ObservationNorm(in_keys=["obs"]), VecNorm(in_keys=["obs"], decay=0.5),
                RewardScaling(0.0, 1.0))
    fresh.load_state_dict(state)
    assert torch.equal(fresh.transform[0].loc, norm.loc)
    assert torch.equal(fresh.transform[1].state_dict()["obs_sum"], vec.state_dict()["obs_sum"])
    assert fresh.transform[2].scale.item() == 3.0


def test_dumps_loads_and_refusals(tmp_path):
    norm = ObservationNorm(loc=2.0, scale=0.5, in_keys=["obs"])
    rb = _rb(norm)
    rb.extend(_data())
    rb.dumps(tmp_path / "c")
    fresh = _rb(ObservationNorm(in_keys=["obs"]))
    fresh.loads(tmp_path / "c")
    assert fresh.transform[0].loc.item() == 2.0
    # another set of transforms with state: refused, nothing changed
    other = _rb(RewardScaling(0.0, 1.0))
    with pytest.raises(CheckpointError, match="RewardScaling"):
        other.loads(tmp_path / "c")
    assert len(other) == 0 and other.transform[0].scale.item() == 1.0
    state = rb.state_dict()
    state["_transform"]["0:ObservationNorm"] = {"loc": 1.0}
    with pytest.raises(ValueError, match="_transform"):
        fresh.load_state_dict(state)
    assert fresh.transform[0].loc.item() == 2.0


def test_uninitialized_observation_norm_saves_empty_state():
    rb = _rb(ObservationNorm(in_keys=["obs"]))
    assert rb.state_dict()["_transform"] == {"0:ObservationNorm": {}}
