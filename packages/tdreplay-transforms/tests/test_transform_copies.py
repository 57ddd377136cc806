"""Every transform with state pickles and deep-copies (a buffer holding it does: a worker gets a
pickled copy): the copy holds the same state, transforms alike, and is independent of the
original. VecNorm's lock does not travel (the copy gets its own), except a multiprocessing
lock to a process being started, where shared statistics stay shared."""

from __future__ import annotations

import contextlib
import copy
import multiprocessing as mp
import multiprocessing.context
import pickle
import threading

import pytest
import torch
from tensordict import TensorDict

import tdreplay.transforms as transforms
from tdreplay.core.testing import assert_same
from tdreplay.transforms import MultiStepTransform, ObservationNorm, RewardScaling, VecNorm

_COPIES = {"pickle": lambda obj: pickle.loads(pickle.dumps(obj)), "deepcopy": copy.deepcopy}


def _data(seed=0):
    g = torch.Generator().manual_seed(seed)
    return TensorDict({"obs": torch.randn(16, 3, generator=g) * 2 + 1,
                       ("next", "reward"): torch.randn(16, 1, generator=g)}, [16])


def _observation_norm():
    norm = ObservationNorm(in_keys=["obs"], standard_normal=True)
    norm.init_stats_from(_data(5))
    return norm


def _multistep_transform():
    t = MultiStepTransform(n_steps=2, gamma=0.9)
    t.inv(_data(4).set(("next", "done"), torch.zeros(16, 1, dtype=torch.bool)))  # holds 2 steps
    return t


_WITH_STATE = {  # a used instance of every transform of tdreplay.transforms with state
    "MultiStepTransform": _multistep_transform,
    "ObservationNorm": _observation_norm,
    "RewardScaling": lambda: RewardScaling(loc=0.5, scale=2.0, in_keys=[("next", "reward")]),
    "VecNorm": lambda: VecNorm(in_keys=["obs"], decay=0.9),
    "VecNorm-lock": lambda: VecNorm(in_keys=["obs"], decay=0.9, lock=threading.RLock()),
}


def test_every_transform_with_state_is_covered():
    with_state = {name for name in transforms.__all__
                  if getattr(getattr(transforms, name), "has_state", False) is True}
    assert with_state == {name.split("-")[0] for name in _WITH_STATE}


@pytest.mark.parametrize("how", sorted(_COPIES))
@pytest.mark.parametrize("name", sorted(_WITH_STATE))
def test_a_transform_with_state_copies(name, how):
    original = _WITH_STATE[name]()
    original(_data(1))
    copied = _COPIES[how](original)
    assert type(copied) is type(original)
    assert_same(copied.state_dict(), original.state_dict())
    data = _data(2)
    assert_same(copied(data.clone()), original(data.clone()))
    assert_same(copied.state_dict(), original.state_dict())  # both went through data
    if name.startswith("VecNorm"):
        assert copied.lock is not original.lock
        with copied.lock:  # a working lock of its own
            pass
        copied(_data(3))  # the copy's statistics are its own
        assert not torch.equal(copied.state_dict()["obs_sum"], original.state_dict()["obs_sum"])


def test_vecnorm_frozen_copy_has_its_own_lock():
    t = VecNorm(in_keys=["obs"])
    t(_data())
    frozen = t.frozen_copy()
    assert frozen.frozen and frozen.lock is not t.lock and not t.frozen


@contextlib.contextmanager
def _pickling_for_a_process_being_started():
    """What ``Process.start()`` of the spawn start method sets while it pickles the child's
    arguments."""
    multiprocessing.context.set_spawning_popen(object())
    try:
        yield
    finally:
        multiprocessing.context.set_spawning_popen(None)


def test_only_a_multiprocessing_lock_goes_to_a_process_being_started():
    process_lock, thread_lock = mp.get_context("spawn").Lock(), threading.Lock()
    with _pickling_for_a_process_being_started():
        assert VecNorm(lock=process_lock).__getstate__()["lock"] is process_lock
        copied = pickle.loads(pickle.dumps(VecNorm(lock=thread_lock)))
    assert copied.lock is not thread_lock and VecNorm(lock=process_lock).__getstate__()[
        "lock"] is None  # any other copy: a lock of its own


def test_shared_statistics_stay_shared_with_a_spawned_child():
    shared = TensorDict({"obs_sum": torch.zeros(3), "obs_ssq": torch.zeros(3),
                         "obs_count": torch.zeros(1)}, []).share_memory_()
    context = mp.get_context("spawn")
    lock = context.Lock()
    t = VecNorm(in_keys=["obs"], shared_td=shared, lock=lock, decay=1.0)
    child = context.Process(target=t, args=(_data(7),))  # the child runs t on a batch
    child.start()
    child.join(timeout=120)
    assert child.exitcode == 0
    assert shared["obs_count"].item() == pytest.approx(16.0)  # the child's update, seen here
