"""Damaged transform states in a buffer's state_dict are refused with a ``ValueError`` naming
the entry, before anything changes; every state a real history saves loads."""

from __future__ import annotations

import re

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.storages import LazyTensorStorage
from tdreplay.transforms import ObservationNorm, RewardScaling, VecNorm


def _data(n=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return TensorDict({"obs": torch.randn(n, 3, generator=g) * 4 + 1,
                       "reward": torch.randn(n, 1, generator=g)}, [n])


def _norm():
    norm = ObservationNorm(in_keys=["obs"], standard_normal=True)
    norm.init_stats_from(_data(20, seed=5))
    return norm


MAKERS = {
    "ObservationNorm": _norm,
    "RewardScaling": lambda: RewardScaling(1.0, 2.0),
    "VecNorm": lambda: VecNorm(in_keys=["obs"], decay=0.9),
}


def _rb(name):
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(16), batch_size=4)
    rb.append_transform(MAKERS[name]())
    return rb


def _filled(name, seed):
    rb = _rb(name)
    rb.extend(_data(8, seed))
    rb.sample()
    return rb


def _same(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and bool((a == b).all())
    if hasattr(a, "keys"):  # a TensorDict
        return (a == b).all()
    return a == b


def _refused(name, damage, match):
    state = _filled(name, seed=1).state_dict()
    entry = state["_transform"][f"0:{name}"]
    damage(entry)
    dst = _filled(name, seed=2)
    before = dst.state_dict()
    with pytest.raises(ValueError, match=match):
        dst.load_state_dict(state)
    assert _same(dst.state_dict(), before)


AFFINE_DAMAGE = {
    "standard_normal-empty": (lambda e: e.update(standard_normal=torch.zeros(0, dtype=torch.bool)),
                              "standard_normal"),
    "standard_normal-two": (lambda e: e.update(standard_normal=torch.tensor([True, False])),
                            "standard_normal"),
    "loc-nan": (lambda e: e.update(loc=torch.full_like(e["loc"], float("nan"))), "'loc'.*non-finite"),
    "scale-inf": (lambda e: e.update(scale=torch.full_like(e["scale"], float("inf"))),
                  "'scale'.*non-finite"),
    "loc-scale-shapes": (lambda e: e.update(loc=torch.zeros(7), scale=torch.ones(5)),
                         "do not broadcast"),
}


@pytest.mark.parametrize("name", ["ObservationNorm", "RewardScaling"])
@pytest.mark.parametrize("damage", list(AFFINE_DAMAGE))
def test_damaged_loc_scale_states_are_refused(name, damage):
    fn, match = AFFINE_DAMAGE[damage]
    _refused(name, fn, match)


VEC_DAMAGE = {
    "ssq-missing": (lambda e: e.pop("obs_ssq"), "holds only"),
    "count-missing": (lambda e: e.pop("obs_count"), "holds only"),
    "sum-int": (lambda e: e.update(obs_sum=e["obs_sum"].long()), "obs_sum.*finite floating"),
    "count-int": (lambda e: e.update(obs_count=torch.tensor(3)), "obs_count.*finite floating"),
    "ssq-nan": (lambda e: e.update(obs_ssq=torch.full_like(e["obs_ssq"], float("nan"))),
                "obs_ssq.*finite floating"),
    "sum-shape": (lambda e: e.update(obs_sum=e["obs_sum"][:-1].clone()), "has shape"),
    "count-negative": (lambda e: e.update(obs_count=-e["obs_count"]), "count >= 0"),
    "count-two": (lambda e: e.update(obs_count=torch.ones(2)), "count >= 0"),
}


@pytest.mark.parametrize("damage", list(VEC_DAMAGE))
def test_damaged_vecnorm_statistics_are_refused(damage):
    fn, match = VEC_DAMAGE[damage]
    _refused("VecNorm", fn, match)


@pytest.mark.parametrize("name", list(MAKERS))
@pytest.mark.parametrize("seed", range(6))
def test_states_of_random_histories_load_and_sample_alike(name, seed):
    g = torch.Generator().manual_seed(seed)
    rb = _rb(name)
    for step in range(int(torch.randint(1, 6, (1,), generator=g))):
        rb.extend(_data(int(torch.randint(1, 9, (1,), generator=g)), seed=seed * 10 + step))
        for _ in range(int(torch.randint(0, 3, (1,), generator=g))):
            rb.sample()
    state = rb.state_dict()
    twin = _rb(name)
    twin.load_state_dict(state)
    assert _same(twin.state_dict(), state)
    data = _data(4, seed=99)
    assert torch.allclose(rb.transform(data.clone())["obs"], twin.transform(data.clone())["obs"])


@pytest.mark.parametrize("name", ["ObservationNorm", "RewardScaling"])
def test_loc_scale_of_another_shape_than_the_held_ones_are_refused(name):
    # consistent with each other (they broadcast), but not the shapes of the stats held: the
    # outputs would broadcast to other shapes (as torch's load_state_dict, TorchRL refuses)
    held = tuple(_filled(name, seed=2).transform[0].loc.shape)
    other = (7,) if held != (7,) else (2,)
    _refused(name, lambda e: e.update(loc=torch.zeros(other), scale=torch.ones(other)),
             re.escape(f"'loc'] has shape {other}, this {name}'s loc {held}"))


def test_an_uninitialized_observation_norm_takes_stats_of_any_shape():
    state = _filled("ObservationNorm", seed=1).state_dict()
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(16), batch_size=4)
    rb.append_transform(ObservationNorm(in_keys=["obs"], standard_normal=True))
    rb.load_state_dict(state)
    assert rb.transform[0].loc.shape == state["_transform"]["0:ObservationNorm"]["loc"].shape
