"""Priority schedulers (LinearScheduler, StepScheduler, LambdaScheduler, SchedulerList), tensor
alpha / beta, and the scheduler's state in the buffer's checkpoint."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from tdreplay.core import ListStorage, RandomSampler, ReplayBuffer
from tdreplay.samplers import (
    LambdaScheduler,
    LinearScheduler,
    ParameterScheduler,
    PrioritizedSampler,
    SchedulerList,
    StalenessAwareSampler,
    StepScheduler,
    TensorDictPrioritizedReplayBuffer,
)
from tdreplay.storages import LazyTensorStorage


def _rb(alpha: float | torch.Tensor = 0.8, beta: float | torch.Tensor = 0.4) -> ReplayBuffer:
    rb = ReplayBuffer(storage=LazyTensorStorage(16),
                      sampler=PrioritizedSampler(16, alpha=alpha, beta=beta))
    rb.extend(torch.arange(10.0))
    return rb


def test_tensor_alpha_beta_accepted_as_floats() -> None:
    s = PrioritizedSampler(8, alpha=torch.tensor(0.7), beta=torch.tensor(0.5, dtype=torch.float64))
    assert s.alpha == pytest.approx(0.7) and s.beta == 0.5
    s.beta = torch.tensor([0.9])
    assert s.beta == pytest.approx(0.9)
    rb = TensorDictPrioritizedReplayBuffer(alpha=torch.tensor(1.0), beta=torch.tensor(0.1),
                                           storage=ListStorage(10))
    assert rb.sampler.alpha == 1.0


@pytest.mark.parametrize("bad", [torch.tensor([0.1, 0.2]), torch.tensor(True),
                                 torch.tensor(1 + 1j)])
def test_bad_tensor_alpha_refused_unchanged(bad: torch.Tensor) -> None:
    s = PrioritizedSampler(8, alpha=0.7, beta=0.5)
    with pytest.raises(TypeError, match="alpha"):
        s.alpha = bad
    with pytest.raises(ValueError, match="alpha"):
        s.alpha = torch.tensor(-1.0)
    assert s.alpha == 0.7


def test_linear_ramp_then_holds() -> None:
    rb = _rb()
    sch = LinearScheduler(rb, "alpha", final_value=0.0, num_steps=4)
    seen = []
    for _ in range(6):
        sch.step()
        seen.append(round(rb.sampler.alpha, 6))
        rb.sample(4)
    assert seen == [0.6, 0.4, 0.2, 0.0, 0.0, 0.0]
    assert sch.step_count == 6


def test_linear_on_tensor_parameter_keeps_dtype() -> None:
    class TensorParam(RandomSampler):
        def __init__(self) -> None:
            self.temperature = torch.tensor(2.0, dtype=torch.float64)

    s = TensorParam()
    sch = LinearScheduler(s, "temperature", final_value=1, num_steps=2)
    sch.step()
    assert isinstance(s.temperature, torch.Tensor) and s.temperature.dtype == torch.float64
    assert s.temperature.item() == 1.5


@pytest.mark.parametrize("mode,expected", [("additive", [0.4, 0.4, 0.5, 0.5, 0.6]),
                                           ("multiplicative", [0.4, 0.4, 0.2, 0.2, 0.1])])
def test_step_every_n_steps(mode: str, expected: list[float]) -> None:
    rb = _rb()
    gamma = 0.1 if mode == "additive" else 0.5
    sch = StepScheduler(rb, "beta", gamma=gamma, n_steps=2, mode=mode)
    seen = []
    for _ in range(5):
        seen.append(round(rb.sampler.beta, 6))
        sch.step()
    assert seen == expected


def test_step_clipped_to_bounds() -> None:
    rb = _rb(beta=0.9)
    sch = StepScheduler(rb, "beta", gamma=0.1, mode="additive", max_value=1.0)
    for _ in range(5):
        sch.step()
    assert rb.sampler.beta == 1.0
    low = StepScheduler(rb, "alpha", gamma=0.5, min_value=0.3)
    for _ in range(5):
        low.step()
    assert rb.sampler.alpha == 0.3   # a bound of 0 or 0.3 is a bound (TorchRL drops a 0 bound)


def test_lambda_and_list() -> None:
    s = PrioritizedSampler(8, alpha=1.0, beta=0.5)
    both = SchedulerList([LambdaScheduler(s, "alpha", lambda n: 1 - n / 10),
                          StepScheduler(s, "beta", gamma=2.0)])
    both.step()
    both.step()
    assert (round(s.alpha, 6), s.beta) == (0.8, 2.0)
    assert len(both) == 2
    single = SchedulerList(StepScheduler(s, "beta", gamma=0.5))
    single.step()
    assert s.beta == 1.0


@pytest.mark.parametrize("kwargs,err,match", [
    ({"obj": object(), "param_name": "beta"}, TypeError, "obj"),
    ({"param_name": "gamma"}, ValueError, "gamma"),
    ({"param_name": "_beta"}, ValueError, "param_name"),
    ({"param_name": "beta", "num_steps": 0}, ValueError, "num_steps"),
    ({"param_name": "beta", "num_steps": 2.5}, TypeError, "num_steps"),
    ({"param_name": "beta", "final_value": "x"}, TypeError, "final_value"),
])
def test_linear_bad_arguments(kwargs: dict, err: type, match: str) -> None:
    args = {"obj": _rb(), "final_value": 1.0, "num_steps": 4, **kwargs}
    with pytest.raises(err, match=match):
        LinearScheduler(**args)


def test_step_bad_arguments() -> None:
    rb = _rb()
    with pytest.raises(ValueError, match="Invalid mode"):
        StepScheduler(rb, "beta", mode="exp")
    with pytest.raises(ValueError, match="min_value"):
        StepScheduler(rb, "beta", min_value=2.0, max_value=1.0)
    with pytest.raises(TypeError, match="n_steps"):
        StepScheduler(rb, "beta", n_steps=True)
    with pytest.raises(TypeError, match="ParameterScheduler"):
        SchedulerList([object()])  # type: ignore[list-item]


def test_refused_value_leaves_scheduler_where_it_was() -> None:
    rb = _rb(alpha=0.2)
    sch = StepScheduler(rb, "alpha", gamma=-0.3, mode="additive")
    with pytest.raises(ValueError, match="alpha"):
        sch.step()
    assert sch.step_count == 0 and rb.sampler.alpha == 0.2


def test_scheduler_state_round_trip_and_checks() -> None:
    s = PrioritizedSampler(8, alpha=1.0, beta=0.5)
    sch = LinearScheduler(s, "beta", 1.0, num_steps=10)
    for _ in range(3):
        sch.step()
    state = sch.state_dict()
    other = LinearScheduler(PrioritizedSampler(8, alpha=1.0, beta=0.2), "beta", 0.0, 2)
    other.load_state_dict(state)
    assert (other.step_count, other.initial_value, other.final_value, other.num_steps) == \
        (3, 0.5, 1.0, 10)
    other.step()
    assert other.sampler.beta == pytest.approx(0.7)
    for key, bad in (("step_count", -1), ("num_steps", 0), ("initial_value", "x")):
        with pytest.raises(ValueError, match=key):
            other.load_state_dict({**state, key: bad})
    with pytest.raises(ValueError, match="keys differ"):
        other.load_state_dict({"step_count": 1})
    assert other.step_count == 4
    lst = SchedulerList([other])
    lst.load_state_dict(lst.state_dict())
    with pytest.raises(ValueError, match="one state per scheduler"):
        lst.load_state_dict({})


def test_scheduler_state_in_buffer_state_dict() -> None:
    rb = _rb()
    sch = StepScheduler(rb, "beta", gamma=0.1, n_steps=3, mode="additive")
    for _ in range(4):
        sch.step()
    state = rb.state_dict()
    assert state["_stateful"]["scheduler.beta"]["step_count"] == 4
    rb2 = _rb()
    sch2 = StepScheduler(rb2, "beta", gamma=0.1, n_steps=3, mode="additive")
    rb2.load_state_dict(state)
    assert sch2.step_count == 4 and rb2.sampler.beta == pytest.approx(0.5)
    for _ in range(2):
        sch.step()
        sch2.step()
    assert rb2.sampler.beta == pytest.approx(rb.sampler.beta) == pytest.approx(0.6)


def test_scheduler_state_in_buffer_checkpoint(tmp_path: Path) -> None:
    rb = _rb()
    alpha = LinearScheduler(rb, "alpha", final_value=0.0, num_steps=8)
    beta = LinearScheduler(rb, "beta", final_value=1.0, num_steps=6)
    for _ in range(3):
        SchedulerList([alpha, beta]).step()
    rb.dumps(tmp_path)

    rb2 = _rb()
    alpha2 = LinearScheduler(rb2, "alpha", final_value=0.0, num_steps=8)
    beta2 = LinearScheduler(rb2, "beta", final_value=1.0, num_steps=6)
    rb2.loads(tmp_path)
    assert (alpha2.step_count, beta2.step_count) == (3, 3)
    for sch in (alpha, beta, alpha2, beta2):
        sch.step()
    assert rb2.sampler.alpha == pytest.approx(rb.sampler.alpha) == pytest.approx(0.4)
    assert rb2.sampler.beta == pytest.approx(rb.sampler.beta) == pytest.approx(0.8)

    # a checkpoint saved before the schedulers were added loads (as TorchRL's, whose
    # schedulers are outside the checkpoint): the buffer's state is the saved one, the
    # schedulers stay where they were and their next step goes on from there
    plain = _rb(alpha=0.6, beta=0.2)
    plain.dumps(tmp_path / "plain")
    rb2.loads(tmp_path / "plain")
    assert (alpha2.step_count, beta2.step_count) == (4, 4)
    assert rb2.sampler.alpha == pytest.approx(0.6) and rb2.sampler.beta == pytest.approx(0.2)
    alpha2.step()
    assert alpha2.step_count == 5 and rb2.sampler.alpha == pytest.approx(0.3)  # 0.8 - 5 * 0.1
    # the same through state_dict
    rb3 = _rb()
    LinearScheduler(rb3, "alpha", final_value=0.0, num_steps=8)
    rb3.load_state_dict(plain.state_dict())
    assert rb3.sampler.alpha == pytest.approx(0.6)


def test_int_parameter_gets_the_nearest_int() -> None:
    # StalenessAwareSampler refuses a float max_staleness / consumer_version: each scheduled
    # value is set as the nearest int (TorchRL sets floats; tdreplay raised TypeError)
    s = StalenessAwareSampler(max_staleness=2)
    linear = LinearScheduler(s, "max_staleness", 10, 5)
    seen = []
    for _ in range(6):
        linear.step()
        seen.append(s.max_staleness)
    assert seen == [4, 5, 7, 8, 10, 10] and all(type(v) is int for v in seen)
    step = StepScheduler(s, "consumer_version", 1, mode="additive")
    step.step()
    step.step()
    assert s.consumer_version == 2 and step.step_count == 2
    # a rollback of a SchedulerList sets the int back
    s.consumer_version = 5
    halving = StepScheduler(s, "consumer_version", 0.5)
    refused = StepScheduler(PrioritizedSampler(4, 0.5, 0.5), "alpha", -1.0, mode="additive")
    with pytest.raises(ValueError, match="alpha"):
        SchedulerList([halving, refused]).step()
    assert s.consumer_version == 5 and halving.step_count == 0
    # a float parameter is left a float, and an int parameter that takes floats gets them

    class Tempered(RandomSampler):
        temperature = 1

    t = Tempered()
    LinearScheduler(t, "temperature", 0.0, 4).step()
    assert t.temperature == 0.75


def test_lambda_returning_no_number_names_lambda_fn() -> None:
    s = PrioritizedSampler(8, alpha=0.7, beta=0.5)
    sch = LambdaScheduler(s, "beta", lambda n: None)
    with pytest.raises(TypeError, match=r"lambda_fn\(1\) must be a real number"):
        sch.step()
    assert sch.step_count == 0 and s.beta == 0.5


def test_step_is_thread_safe_under_the_buffer_lock() -> None:
    rb = _rb(beta=0.0)
    sch = StepScheduler(rb, "beta", gamma=0.001, mode="additive")
    errors: list[BaseException] = []

    def stepper() -> None:
        try:
            for _ in range(200):
                sch.step()
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    def sampler() -> None:
        try:
            for _ in range(50):
                rb.sample(8)
        except BaseException as err:  # pragma: no cover
            errors.append(err)

    threads = [threading.Thread(target=stepper) for _ in range(2)] + \
        [threading.Thread(target=sampler)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sch.step_count == 400 and rb.sampler.beta == pytest.approx(0.4)


def test_base_is_abstract() -> None:
    with pytest.raises(TypeError):
        ParameterScheduler(_rb(), "beta")  # type: ignore[abstract]
