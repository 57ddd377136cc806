"""TorchRL's scheduler attribute names (``initial_val``, ``final_val``) and ``state_dict`` keys:
tdreplay's schedulers answer to the names and load TorchRL's states (its own ``state_dict``
keeps tdreplay's keys)."""

from __future__ import annotations

import math

import pytest
import torch

from tdreplay.samplers import (
    LambdaScheduler,
    LinearScheduler,
    PrioritizedSampler,
    StepScheduler,
)

OWN_LINEAR_KEYS = ['final_value', 'initial_value', 'max_value', 'min_value', 'num_steps',
                   'step_count']


def _sampler(beta: float | torch.Tensor = 0.4) -> PrioritizedSampler:
    return PrioritizedSampler(10, alpha=0.5, beta=beta)


# TorchRL 0.14.1 states (``scheduler.state_dict()`` printed after the steps noted), with the
# functions it holds replaced by stand-ins
def torchrl_linear(tensor: bool = False) -> dict:
    # LinearScheduler(sampler(beta=0.4), "beta", final_value=1.0, num_steps=4), 2 steps
    v = (lambda x: torch.tensor(x)) if tensor else (lambda x: x)
    return {"param_name": "beta", "_min_val": -math.inf, "_max_val": math.inf,
            "initial_val": v(0.4), "_step_cnt": 2, "final_val": v(1.0), "num_steps": 4,
            "_delta": v(0.15)}


def torchrl_step() -> dict:
    # StepScheduler(sampler(beta=0.4), "beta", gamma=0.1, n_steps=2, mode="additive",
    # max_value=0.75), 3 steps (beta 0.5)
    return {"param_name": "beta", "_min_val": -math.inf, "_max_val": 0.75, "initial_val": 0.4,
            "_step_cnt": 3, "gamma": 0.1, "n_steps": 2, "mode": "additive", "operator": max}


def torchrl_lambda() -> dict:
    # LambdaScheduler(sampler(beta=0.4), "beta", lambda n: 1 + n / 10, max_value=1.0), 3 steps
    return {"param_name": "beta", "_min_val": -math.inf, "_max_val": 1.0, "initial_val": 0.4,
            "_step_cnt": 3, "lambda_fn": abs}


# ---- attribute names ------------------------------------------------------------------------------
def test_repro_initial_val_and_final_val() -> None:
    s = LinearScheduler(_sampler(), param_name="beta", final_value=1.0, num_steps=4)
    assert (s.initial_val, s.final_val, s.num_steps) == (0.4, 1.0, 4)
    s.step()
    s.step()
    assert sorted(s.state_dict()) == OWN_LINEAR_KEYS  # tdreplay's own keys, as before


def test_aliases_are_settable_and_checked() -> None:
    s = LinearScheduler(_sampler(), param_name="beta", final_value=1.0, num_steps=4)
    s.final_val = 0.8
    s.initial_val = 0.0
    assert (s.final_value, s.initial_value) == (0.8, 0.0)
    s.step()
    assert s.sampler.beta == pytest.approx(0.2)
    with pytest.raises(ValueError, match="final_val"):
        s.final_val = math.nan
    with pytest.raises(TypeError, match="initial_val"):
        s.initial_val = "0.1"
    assert (s.final_value, s.initial_value) == (0.8, 0.0)


def test_initial_val_on_every_scheduler_and_tensors() -> None:
    step = StepScheduler(_sampler(torch.tensor(0.25)), "beta")
    lam = LambdaScheduler(_sampler(), "beta", lambda n: 1.0)
    assert isinstance(step.initial_val, torch.Tensor) and step.initial_val.item() == 0.25
    assert lam.initial_val == 0.4
    lin = LinearScheduler(_sampler(torch.tensor(0.4)), "beta", final_value=1.0, num_steps=2)
    assert isinstance(lin.final_val, torch.Tensor) and lin.final_val.item() == 1.0


# ---- TorchRL state_dicts ---------------------------------------------------------------------------
@pytest.mark.parametrize("tensor", [False, True])
def test_linear_loads_torchrl_state_and_goes_on(tensor: bool) -> None:
    beta = torch.tensor(0.4) if tensor else 0.4
    s = LinearScheduler(_sampler(beta), "beta", final_value=0.5, num_steps=9)
    state = torchrl_linear(tensor)
    s.check_state_dict(state)  # checking changes nothing
    assert (s.step_count, s.num_steps) == (0, 9)
    s.load_state_dict(state)
    assert (s.step_count, s.num_steps, float(s.final_val), float(s.initial_val)) == \
        (2, 4, 1.0, pytest.approx(0.4))
    assert isinstance(s.initial_value, torch.Tensor) is tensor
    values = []
    for _ in range(3):  # TorchRL's steps 3, 4, 5
        s.step()
        values.append(float(s.sampler.beta))
    assert values == pytest.approx([0.85, 1.0, 1.0])
    assert sorted(s.state_dict()) == OWN_LINEAR_KEYS


def test_step_and_lambda_load_torchrl_state() -> None:
    sampler = _sampler(0.5)  # where TorchRL's sampler was after its 3 steps
    step = StepScheduler(sampler, "beta", gamma=0.1, n_steps=2, mode="additive", max_value=0.75)
    step.load_state_dict(torchrl_step())
    assert step.step_count == 3 and step.max_value == 0.75 and step.gamma == 0.1
    step.step()  # TorchRL's step 4: + 0.1
    assert sampler.beta == pytest.approx(0.6)
    assert sorted(step.state_dict()) == ["gamma", "initial_value", "max_value", "min_value",
                                         "mode", "n_steps", "step_count"]

    fn = lambda n: 1 + n / 10  # noqa: E731
    lam = LambdaScheduler(_sampler(), "beta", fn, max_value=1.0)
    lam.load_state_dict(torchrl_lambda())
    assert lam.step_count == 3 and lam.lambda_fn is fn  # keeps its own function
    lam.step()
    assert lam.sampler.beta == pytest.approx(0.4 * 1.4)


def test_torchrl_state_of_another_parameter_or_kind_is_refused_unchanged() -> None:
    s = LinearScheduler(_sampler(), "alpha", final_value=1.0, num_steps=3)
    with pytest.raises(ValueError, match="param_name='beta'"):
        s.load_state_dict(torchrl_linear())
    step = StepScheduler(_sampler(), "beta")
    with pytest.raises(ValueError, match="keys differ"):
        step.load_state_dict(torchrl_linear())  # a LinearScheduler's state
    lin = LinearScheduler(_sampler(), "beta", final_value=1.0, num_steps=3)
    with pytest.raises(ValueError, match="keys differ"):
        lin.load_state_dict({**torchrl_linear(), "extra": 1})
    with pytest.raises(ValueError, match="num_steps"):
        lin.load_state_dict({**torchrl_linear(), "num_steps": 0})
    for sch in (s, step, lin):
        assert sch.step_count == 0
    assert (lin.num_steps, lin.final_value) == (3, 1.0)


def test_own_state_round_trip_unchanged() -> None:
    a = LinearScheduler(_sampler(), "beta", final_value=1.0, num_steps=4)
    a.step()
    b = LinearScheduler(_sampler(0.1), "beta", final_value=0.0, num_steps=2)
    b.load_state_dict(a.state_dict())
    assert b.state_dict() == a.state_dict()
