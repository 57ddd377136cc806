"""Scheduler ``check_state_dict`` / ``load_state_dict`` refuse every value the constructors
refuse, by TorchRL's keys as by tdreplay's and through ``rb.load_state_dict``: a NaN, infinite
or meta-tensor ``initial_value`` (or a negative one for an exponent the sampler refuses below
0), a NaN or meta-tensor bound, ``min_value > max_value``, a ``LinearScheduler`` ``final_value``
out of the parameter's range, a ``StepScheduler`` ``gamma`` that is not finite or is negative in
multiplicative mode, and a ``step_count`` that is negative or not an int. Before, most of them
loaded and every later ``step()`` raised, or the bounds were silently disabled or inverted.
The error is a ``ValueError`` naming the field, and nothing changes: the scheduler's state, and
the parameter after a later ``step()``, equal those of a twin that never got the call."""

import math

import pytest
import torch
from tensordict import TensorDict

from tdreplay.samplers import (
    LambdaScheduler,
    LinearScheduler,
    StepScheduler,
    TensorDictPrioritizedReplayBuffer,
)
from tdreplay.storages import LazyTensorStorage

NAN, INF = float("nan"), float("inf")


def meta():
    return torch.tensor(0.5, device="meta")


def build(kind):
    rb = TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.4, storage=LazyTensorStorage(32),
                                           batch_size=4)
    rb.extend(TensorDict({"x": torch.arange(10.0)}, [10]))
    if kind == "linear":
        scheduler = LinearScheduler(rb, "beta", final_value=1.0, num_steps=4)
    elif kind == "step":
        scheduler = StepScheduler(rb, "beta", gamma=0.9, min_value=0.1, max_value=0.9)
    else:
        scheduler = LambdaScheduler(rb, "beta", lambda n: 1 + n / 10, max_value=1.0)
    scheduler.step()
    return rb, scheduler


_TORCHRL = {"step_count": "_step_cnt", "initial_value": "initial_val", "min_value": "_min_val",
            "max_value": "_max_val", "final_value": "final_val"}


def torchrl_state(state):
    return {"param_name": "beta", **{_TORCHRL.get(k, k): v for k, v in state.items()}}


def same(a, b):
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and bool(torch.equal(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


COMMON = [
    ({"initial_value": NAN}, "initial_value"),
    ({"initial_value": INF}, "initial_value"),
    ({"initial_value": -3.0}, "initial_value"),
    ({"initial_value": meta()}, "initial_value"),
    ({"initial_value": "0.4"}, "initial_value"),
    ({"min_value": NAN}, "min_value"),
    ({"max_value": NAN}, "max_value"),
    ({"min_value": meta()}, "min_value"),
    ({"max_value": meta()}, "max_value"),
    ({"min_value": 5.0, "max_value": 1.0}, "min_value"),
    ({"min_value": 0.6, "max_value": torch.tensor(0.5)}, "max_value"),
    ({"step_count": -1}, "step_count"),
    ({"step_count": 1.5}, "step_count"),
    ({"step_count": True}, "step_count"),
    ({"step_count": "2"}, "step_count"),
]
CASES = [(kind, change, field) for kind in ("linear", "step", "lambda")
         for change, field in COMMON]
CASES += [("linear", change, "final_value") for change in (
    {"final_value": -1.0}, {"final_value": NAN}, {"final_value": INF},
    {"final_value": meta()}, {"final_value": None})]
CASES += [("step", change, "gamma") for change in (
    {"gamma": -1.0}, {"gamma": -0.5, "mode": "multiplicative"}, {"gamma": NAN}, {"gamma": INF},
    {"gamma": meta()}, {"gamma": "0.9"})]


def ids(case):
    return repr(case) if not isinstance(case, dict) else ",".join(
        f"{k}={'meta' if isinstance(v, torch.Tensor) and v.is_meta else v}"
        for k, v in case.items())


def assert_as_twin(rb, scheduler, twin_rb, twin, before):
    assert same(scheduler.state_dict(), before)
    assert same(scheduler.state_dict(), twin.state_dict())
    for _ in range(5):
        scheduler.step()
        twin.step()
        assert rb.sampler.beta == twin_rb.sampler.beta
    assert same(scheduler.state_dict(), twin.state_dict())


@pytest.mark.parametrize("keys", ["native", "torchrl"])
@pytest.mark.parametrize(("kind", "change", "field"), CASES, ids=ids)
def test_refused_and_unchanged(kind, change, field, keys):
    rb, scheduler = build(kind)
    twin_rb, twin = build(kind)
    before = scheduler.state_dict()
    state = {**before, **change}
    if keys == "torchrl":
        state = torchrl_state(state)
    with pytest.raises(ValueError, match=rf"\b{field}\b"):
        scheduler.check_state_dict(state)
    with pytest.raises(ValueError, match=rf"\b{field}\b"):
        scheduler.load_state_dict(state)
    assert_as_twin(rb, scheduler, twin_rb, twin, before)


@pytest.mark.parametrize(("kind", "change", "field"), CASES, ids=ids)
def test_refused_through_buffer(kind, change, field):
    rb, scheduler = build(kind)
    twin_rb, twin = build(kind)
    before, buffer_before = scheduler.state_dict(), rb.state_dict()
    state = rb.state_dict()
    state["_stateful"]["scheduler.beta"].update(change)
    with pytest.raises(ValueError, match=rf"scheduler\.beta.*\b{field}\b"):
        rb.load_state_dict(state)
    assert same(rb.state_dict()["_stateful"], buffer_before["_stateful"])
    assert_as_twin(rb, scheduler, twin_rb, twin, before)


@pytest.mark.parametrize("keys", ["native", "torchrl"])
@pytest.mark.parametrize(("kind", "change"), [
    ("linear", {"min_value": -INF, "max_value": INF, "initial_value": 0.0, "step_count": 0}),
    ("linear", {"final_value": 0.0, "initial_value": torch.tensor(0.3)}),
    ("step", {"gamma": -0.1, "mode": "additive"}),
    ("step", {"gamma": 0.0, "min_value": 0.5, "max_value": 0.5}),
    ("step", {"gamma": torch.tensor(1.1), "max_value": INF}),
    ("lambda", {"min_value": 0.2, "max_value": 0.2, "step_count": 7}),
])
def test_valid_states_still_load(kind, change, keys):
    rb, scheduler = build(kind)
    state = {**scheduler.state_dict(), **change}
    scheduler.load_state_dict(torchrl_state(state) if keys == "torchrl" else state)
    for key, value in change.items():
        assert float(scheduler.state_dict()[key]) == float(value) if key != "mode" \
            else scheduler.state_dict()[key] == value
    scheduler.step()


def test_final_val_setter_refuses_negative_exponent():
    """TorchRL's ``final_val`` setter refuses what the constructor refuses, naming it."""
    _, scheduler = build("linear")
    before = scheduler.state_dict()
    with pytest.raises(ValueError, match=r"\bfinal_val\b.*>= 0"):
        scheduler.final_val = -1.0
    assert same(scheduler.state_dict(), before)
