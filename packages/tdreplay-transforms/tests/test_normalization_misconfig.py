"""Normalisation transforms configured so that they cannot do their job say so: a ``VecNorm``
whose in_keys are none of the data's entries warns (once) that it normalised nothing, and an
``ObservationNorm`` that would divide by a zero ``scale`` is refused naming it."""

from __future__ import annotations

import warnings

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.storages import LazyTensorStorage
from tdreplay.transforms import ObservationNorm, VecNorm


def _data() -> TensorDict:
    return TensorDict({"obs": torch.arange(12.0).view(4, 3)}, [4])


def test_vecnorm_without_any_of_its_keys_warns_once() -> None:
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8), batch_size=2,
                                transform=VecNorm(in_keys=["obz"]))
    rb.extend(_data())
    with pytest.warns(UserWarning, match=r"none of its in_keys \['obz'\] is in the data"):
        out = rb.sample()
    rows = set(map(tuple, _data()["obs"].tolist()))
    assert set(map(tuple, out["obs"].tolist())) <= rows  # the stored rows, not normalised
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rb.sample()  # said once
    assert rb.transform[0].state_dict() == {}


def test_vecnorm_with_some_of_its_keys_does_not_warn() -> None:
    t = VecNorm(in_keys=["obs", ("agent", "pos")], decay=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = t(_data())
    assert sorted(t.state_dict()) == ["obs_count", "obs_ssq", "obs_sum"]
    assert abs(float(out["obs"].mean())) < 1e-5


def test_observation_norm_dividing_by_zero_scale_is_refused() -> None:
    with pytest.raises(ValueError, match="scale holds 0 at 1 of its 3 entries"):
        ObservationNorm(loc=torch.zeros(3), scale=torch.tensor([1.0, 0.0, 2.0]),
                        in_keys=["obs"], standard_normal=True)
    # multiplying by zero is an affine map like any other
    t = ObservationNorm(loc=torch.ones(3), scale=torch.zeros(3), in_keys=["obs"])
    assert t(_data())["obs"].tolist() == [[1.0, 1.0, 1.0]] * 4
    # a number scale is clamped to eps, as before
    assert float(ObservationNorm(loc=0.0, scale=0.0, in_keys=["obs"],
                                 standard_normal=True).scale) > 0


def test_observation_norm_state_with_zero_scale_is_refused() -> None:
    t = ObservationNorm(loc=torch.zeros(3), scale=torch.ones(3), in_keys=["obs"],
                        standard_normal=True)
    state = t.state_dict()
    state["scale"] = torch.tensor([1.0, 0.0, 1.0])
    with pytest.raises(ValueError, match="scale holds 0"):
        t.load_state_dict(state)
    assert t.scale.tolist() == [1.0, 1.0, 1.0]
