"""Scheduler constructors refuse what ``step()`` could never apply (before, they were accepted
and registered with the buffer, replacing its scheduler for the parameter, and every ``step()``
then raised): non-finite ``final_value`` / ``gamma``, a negative ``final_value`` for an exponent
the sampler refuses below 0, a negative multiplicative ``gamma``, and a ``param_name`` naming a
read-only property or a method. The buffer's registered scheduler and its checkpoint stay
exactly as they were. A second scheduler for the same parameter is not silent any more."""

import math
import warnings

import pytest
import torch
from tensordict import TensorDict

from tdreplay.samplers import (
    LinearScheduler,
    PrioritizedSampler,
    StepScheduler,
    TensorDictPrioritizedReplayBuffer,
)
from tdreplay.storages import LazyTensorStorage


def buffer():
    rb = TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.4, storage=LazyTensorStorage(32))
    rb.extend(TensorDict({"x": torch.arange(10.0)}, [10]))
    return rb


def snapshot(rb):
    return (rb.stateful_parts.names, rb.state_dict()["_stateful"], rb.sampler.alpha,
            rb.sampler.beta)


def assert_same(before, after):
    names0, parts0, *values0 = before
    names1, parts1, *values1 = after
    assert names0 == names1
    assert values0 == values1
    assert parts0.keys() == parts1.keys()
    for name in parts0:
        assert parts0[name].keys() == parts1[name].keys()
        for key in parts0[name]:
            a, b = parts0[name][key], parts1[name][key]
            assert a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b))


def registered():
    rb = buffer()
    first = LinearScheduler(rb, "beta", final_value=1.0, num_steps=4)
    first.step()
    first.step()
    return rb, first


BAD = [float("nan"), float("inf"), -float("inf"), torch.tensor(float("nan"))]


@pytest.mark.parametrize("bad", BAD + [-1.0, torch.tensor(-0.5)])
def test_linear_scheduler_refuses_bad_final_value(bad):
    rb, first = registered()
    before = snapshot(rb)
    with pytest.raises(ValueError, match="final_value"):
        LinearScheduler(rb, "beta", final_value=bad, num_steps=3)
    assert_same(before, snapshot(rb))
    assert rb.state_dict()["_stateful"]["scheduler.beta"]["step_count"] == 2


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("mode", ["multiplicative", "additive"])
def test_step_scheduler_refuses_non_finite_gamma(bad, mode):
    rb, _ = registered()
    before = snapshot(rb)
    with pytest.raises(ValueError, match="gamma"):
        StepScheduler(rb, "alpha", gamma=bad, mode=mode)
    assert_same(before, snapshot(rb))


def test_step_scheduler_refuses_negative_multiplicative_gamma():
    rb, _ = registered()
    before = snapshot(rb)
    with pytest.raises(ValueError, match="gamma"):
        StepScheduler(rb, "alpha", gamma=-0.5)
    assert_same(before, snapshot(rb))
    StepScheduler(rb, "alpha", gamma=-0.1, mode="additive", min_value=0.0)  # still allowed


@pytest.mark.parametrize("name", ["eps", "max_capacity", "update_priority", "sample"])
def test_param_name_must_be_settable(name):
    rb, _ = registered()
    before = snapshot(rb)
    with pytest.raises(ValueError, match="param_name"):
        LinearScheduler(rb, name, final_value=0.5, num_steps=2)
    with pytest.raises(ValueError, match="param_name"):
        StepScheduler(rb, name, gamma=0.5)
    assert_same(before, snapshot(rb))


def test_param_name_must_be_settable_on_a_bare_sampler():
    sampler = PrioritizedSampler(10, alpha=0.7, beta=0.4)
    with pytest.raises(ValueError, match="param_name"):
        LinearScheduler(sampler, "eps", final_value=0.5, num_steps=2)
    assert sampler.eps == PrioritizedSampler(10, alpha=0.7, beta=0.4).eps


def test_a_second_scheduler_for_a_parameter_warns():
    rb, _ = registered()
    with pytest.warns(UserWarning, match="param_name='beta'"):
        LinearScheduler(rb, "beta", final_value=0.5, num_steps=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        StepScheduler(rb, "alpha", gamma=0.5)  # the first for alpha: no warning
        rb.register_stateful("scheduler.alpha", None)
        StepScheduler(rb, "alpha", gamma=0.5)  # unregistered first: no warning


def test_a_checkpoint_with_a_non_finite_value_is_refused():
    rb, _ = registered()
    StepScheduler(rb, "alpha", gamma=0.5)
    state = rb.state_dict()
    before = snapshot(rb)
    for part, key in (("scheduler.beta", "final_value"), ("scheduler.alpha", "gamma")):
        bad = {**state, "_stateful": {**state["_stateful"],
                                      part: {**state["_stateful"][part], key: float("nan")}}}
        with pytest.raises(ValueError, match=key):
            rb.load_state_dict(bad)
        assert_same(before, snapshot(rb))
