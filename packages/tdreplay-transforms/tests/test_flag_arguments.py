"""Boolean arguments of the transforms take a bool (or a numpy bool) and nothing else:
``"yes"``, ``1``, ``"False"`` (truthy in TorchRL) or ``None`` raise a ``TypeError`` naming
the transform and the argument. ``ToTensorImage(from_int=None)`` and ``VecNorm(new_api=None)``
(their defaults) are still taken."""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import Any

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import testing
from tdreplay.transforms import (
    CatFrames,
    CatTensors,
    DiscreteActionProjection,
    ExcludeTransform,
    FlattenObservation,
    NextStateReconstructor,
    ObservationNorm,
    PolicyAgeFilter,
    RenameTransform,
    RewardScaling,
    SelectTransform,
    SqueezeTransform,
    ToTensorImage,
    UnsqueezeTransform,
    VecNorm,
)

BAD = testing.NOT_BOOLS
BAD_OR_NONE = testing.NOT_BOOLS_OR_NONE
GOOD = testing.BOOLS

# (transform, build(**{name: value}), name, attribute holding it (None: none))
CONSTRUCTORS: list[tuple[str, Callable[..., Any], str, str | None]] = [
    ("CatFrames", lambda **kw: CatFrames(3, -1, in_keys=["obs"], out_keys=["stack"], **kw),
     "as_inverse", "as_inverse"),
    ("CatFrames", lambda **kw: CatFrames(3, -1, in_keys=["obs"], out_keys=["stack"], **kw),
     "future", "future"),
    ("DiscreteActionProjection",
     lambda **kw: DiscreteActionProjection(num_actions_effective=2, max_actions=3, **kw),
     "include_forward", None),
    ("ToTensorImage", ToTensorImage, "unsqueeze", "unsqueeze"),
    ("ToTensorImage", ToTensorImage, "shape_tolerant", "shape_tolerant"),
    ("RenameTransform", lambda **kw: RenameTransform(["a"], ["b"], **kw), "create_copy",
     "create_copy"),
    ("ExcludeTransform", lambda **kw: ExcludeTransform("a", **kw), "inverse", "inverse"),
    ("SelectTransform", lambda **kw: SelectTransform("a", **kw), "inverse", "inverse"),
    ("SelectTransform", lambda **kw: SelectTransform("a", **kw), "keep_rewards", "keep_rewards"),
    ("SelectTransform", lambda **kw: SelectTransform("a", **kw), "keep_dones", "keep_dones"),
    ("SelectTransform", lambda **kw: SelectTransform("a", **kw), "strict", "strict"),
    ("NextStateReconstructor", NextStateReconstructor, "strict", "strict"),
    ("ObservationNorm", lambda **kw: ObservationNorm(loc=1.0, scale=2.0, in_keys=["obs"], **kw),
     "standard_normal", "standard_normal"),
    ("PolicyAgeFilter", lambda **kw: PolicyAgeFilter(3, 1, **kw), "strict", "strict"),
    ("RewardScaling", lambda **kw: RewardScaling(loc=1.0, scale=2.0, **kw), "standard_normal",
     "standard_normal"),
    ("CatTensors", lambda **kw: CatTensors(["a", "b"], "obs", **kw), "del_keys", "del_keys"),
    ("CatTensors", lambda **kw: CatTensors(["a", "b"], "obs", **kw), "unsqueeze_if_needed",
     "unsqueeze_if_needed"),
    ("CatTensors", lambda **kw: CatTensors(["a", "b"], "obs", **kw), "unsqueeze_if_oor",
     "unsqueeze_if_oor"),
    ("CatTensors", lambda **kw: CatTensors(["a", "b"], "obs", **kw), "sort", None),
    ("FlattenObservation",
     lambda **kw: FlattenObservation(-2, -1, in_keys=["obs"], out_keys=["flat"], **kw),
     "allow_positive_dim", None),
    ("UnsqueezeTransform", lambda **kw: UnsqueezeTransform(-2, in_keys=["obs"], **kw),
     "allow_positive_dim", None),
    ("SqueezeTransform", lambda **kw: SqueezeTransform(-1, in_keys=["obs"], **kw),
     "allow_positive_dim", None),
]
IDS = [f"{c[0]}-{c[2]}" for c in CONSTRUCTORS]


@pytest.mark.parametrize("value", BAD)
@pytest.mark.parametrize("owner, build, name, attribute", CONSTRUCTORS, ids=IDS)
def test_constructors_refuse_a_flag_that_is_not_a_bool(owner, build, name, attribute, value):
    testing.assert_flag_refused(build, name, value, prefix=f"{owner}: ")


@pytest.mark.parametrize("value", GOOD)
@pytest.mark.parametrize("owner, build, name, attribute", CONSTRUCTORS, ids=IDS)
def test_constructors_take_bools_and_numpy_bools(owner, build, name, attribute, value):
    testing.assert_flag_taken(build, name, value,
                              None if attribute is None else attrgetter(attribute))


NONE_DEFAULTS = [
    ("ToTensorImage", ToTensorImage, "from_int"),
    ("VecNorm", lambda **kw: VecNorm(in_keys=["obs"], **kw), "new_api"),
]


@pytest.mark.parametrize("value", BAD_OR_NONE)
@pytest.mark.parametrize("owner, build, name", NONE_DEFAULTS, ids=[n[0] for n in NONE_DEFAULTS])
def test_none_default_flags_refuse_what_is_not_a_bool_or_none(owner, build, name, value):
    with pytest.raises(TypeError, match=f"{owner}: {name} must be a bool or None, got"):
        build(**{name: value})


@pytest.mark.parametrize("value", [None, False, np.bool_(False)])
def test_vecnorm_new_api_takes_false_and_none(value):
    VecNorm(in_keys=["obs"], new_api=value)


@pytest.mark.parametrize("value", [True, np.bool_(True)])
def test_vecnorm_new_api_true_is_still_not_implemented(value):
    with pytest.raises(NotImplementedError, match="VecNormV2"):
        VecNorm(in_keys=["obs"], new_api=value)


@pytest.mark.parametrize("value, scaled", [(None, True), (True, True), (np.bool_(True), True),
                                           (False, False), (np.bool_(False), False)])
def test_to_tensor_image_from_int_as_before(value, scaled):
    td = TensorDict({"pixels": torch.full((2, 2, 3), 255, dtype=torch.uint8)}, [])
    out = ToTensorImage(from_int=value, in_keys=["pixels"])(td)["pixels"]
    assert out.shape == (3, 2, 2) and float(out.max()) == (1.0 if scaled else 255.0)


@pytest.mark.parametrize("value", [np.bool_(True), np.bool_(False)])
def test_numpy_bools_transform_as_python_bools(value):
    td = TensorDict({"a": torch.ones(2, 1), "b": torch.zeros(2, 1), "reward": torch.ones(2, 1)},
                    [2])
    for build in (lambda v: SelectTransform("a", keep_rewards=v),
                  lambda v: RenameTransform(["a"], ["c"], create_copy=v),
                  lambda v: CatTensors(["a", "b"], "obs", del_keys=v)):
        assert sorted(build(value)(td.clone()).keys()) == \
            sorted(build(bool(value))(td.clone()).keys())
