"""``PrioritizedSampler(alpha=tensor, beta=tensor)`` keeps tensors, as TorchRL: ``sampler.beta``
reads back as a tensor (``.item()`` works), through schedulers and checkpoints; numbers stay
numbers; sampling is the same either way."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tdreplay.core import ReplayBuffer
from tdreplay.samplers import (
    LambdaScheduler,
    LinearScheduler,
    PrioritizedSampler,
    PrioritizedSliceSampler,
    SchedulerList,
    StepScheduler,
    TensorDictPrioritizedReplayBuffer,
)
from tdreplay.storages import LazyTensorStorage


def _rb(alpha, beta) -> ReplayBuffer:
    rb = ReplayBuffer(storage=LazyTensorStorage(16),
                      sampler=PrioritizedSampler(16, alpha=alpha, beta=beta), batch_size=8)
    rb.extend(torch.arange(10.0))
    rb.update_priority(torch.arange(10), torch.arange(1.0, 11.0))
    return rb


def test_repro_tensor_alpha_beta_stay_tensors() -> None:
    s = PrioritizedSampler(10, alpha=torch.tensor(0.7), beta=torch.tensor(0.4))
    assert isinstance(s.alpha, torch.Tensor) and isinstance(s.beta, torch.Tensor)
    assert s.alpha.dtype == s.beta.dtype == torch.float32
    assert s.beta.item() == pytest.approx(0.4) and s.alpha.item() == pytest.approx(0.7)
    LinearScheduler(s, param_name="beta", final_value=1.0, num_steps=2).step()
    assert isinstance(s.beta, torch.Tensor) and s.beta.dtype == torch.float32
    assert s.beta.item() == pytest.approx(0.7)  # TorchRL: tensor(0.7000)
    assert "tensor(0.7000)" in repr(s)


def test_numbers_stay_floats_and_dtype_shape_are_kept() -> None:
    s = PrioritizedSampler(10, alpha=0.7, beta=1)
    assert type(s.alpha) is float and type(s.beta) is float and s.beta == 1.0
    s.beta = torch.tensor([0.5], dtype=torch.float64)
    assert s.beta.dtype == torch.float64 and s.beta.shape == (1,) and s.beta.item() == 0.5
    s.beta = 0.25
    assert type(s.beta) is float and s.beta == 0.25


def test_reads_are_copies_and_in_place_changes_do_nothing() -> None:
    s = PrioritizedSampler(10, alpha=torch.tensor(0.7), beta=torch.tensor(0.4))
    given = torch.tensor(0.5)
    s.beta = given
    given.fill_(0.9)  # the sampler keeps the value it was given
    s.beta.fill_(0.9)  # a read is a copy
    assert s.beta.item() == 0.5
    s.beta += 0.25  # read, add, assign: takes effect
    assert s.beta.item() == 0.75 and s.state_dict()["beta"].item() == 0.75


def test_sampling_is_the_same_as_with_floats() -> None:
    floats, tensors = _rb(0.7, 0.4), _rb(torch.tensor(0.7, dtype=torch.float64),
                                         torch.tensor(0.4, dtype=torch.float64))
    for rb in (floats, tensors):
        rb.set_rng(torch.Generator().manual_seed(0))
    (_, a), (_, b) = floats.sample(return_info=True), tensors.sample(return_info=True)
    assert torch.equal(a["index"], b["index"])
    assert torch.equal(a["priority_weight"], b["priority_weight"])
    tensors.sampler.alpha = torch.tensor(1.0)  # the trees are rewritten as for a float
    floats.sampler.alpha = 1.0
    assert tensors.sampler.total_priority == floats.sampler.total_priority


def test_state_dict_round_trips_keep_what_was_given(tmp_path: Path) -> None:
    s = PrioritizedSampler(10, alpha=torch.tensor(0.7), beta=torch.tensor(0.4))
    state = s.state_dict()
    assert isinstance(state["alpha"], torch.Tensor) and isinstance(state["beta"], torch.Tensor)
    fresh = PrioritizedSampler(10, alpha=0.5, beta=0.5)
    fresh.load_state_dict(state)
    assert isinstance(fresh.beta, torch.Tensor) and fresh.beta.item() == pytest.approx(0.4)
    state["beta"].fill_(0.9)  # the loaded sampler holds its own copy
    assert fresh.beta.item() == pytest.approx(0.4)
    fresh.load_state_dict(PrioritizedSampler(10, alpha=0.5, beta=0.25).state_dict())
    assert type(fresh.alpha) is float and fresh.beta == 0.25

    rb = _rb(torch.tensor(0.7), torch.tensor(0.4))
    rb.dumps(tmp_path)
    rb2 = _rb(0.5, 0.5)
    rb2.loads(tmp_path)
    assert isinstance(rb2.sampler.alpha, torch.Tensor)
    assert rb2.sampler.alpha.item() == pytest.approx(0.7)
    assert rb2.sampler.beta.item() == pytest.approx(0.4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_linear_scheduler_with_tensor_values_and_state_round_trip(dtype: torch.dtype) -> None:
    rb = _rb(0.7, torch.tensor(0.6, dtype=dtype))
    sch = LinearScheduler(rb, "beta", final_value=1.0, num_steps=4)
    values = []
    for _ in range(2):
        sch.step()
        assert isinstance(rb.sampler.beta, torch.Tensor) and rb.sampler.beta.dtype == dtype
        values.append(rb.sampler.beta.item())
    assert values == pytest.approx([0.7, 0.8], abs=1e-6)
    state = sch.state_dict()
    assert isinstance(state["initial_value"], torch.Tensor)
    assert isinstance(state["final_value"], torch.Tensor)

    rb2 = _rb(0.7, torch.tensor(0.8, dtype=dtype))
    sch2 = LinearScheduler(rb2, "beta", final_value=0.0, num_steps=9)
    sch2.load_state_dict(state)
    for _ in range(3):
        sch.step()
        sch2.step()
    assert isinstance(rb2.sampler.beta, torch.Tensor) and rb2.sampler.beta.dtype == dtype
    assert rb2.sampler.beta.item() == pytest.approx(1.0)
    assert rb.sampler.beta.item() == pytest.approx(1.0)

    # through the buffer's state_dict too
    rb3 = _rb(0.7, torch.tensor(0.1, dtype=dtype))
    LinearScheduler(rb3, "beta", final_value=0.0, num_steps=9)
    rb3.load_state_dict(rb.state_dict())
    assert isinstance(rb3.sampler.beta, torch.Tensor) and rb3.sampler.beta.item() == 1.0


@pytest.mark.parametrize(("mode", "expected"), [("multiplicative", [0.4, 0.2, 0.2]),
                                                ("additive", [0.7, 0.6, 0.5])])
def test_step_scheduler_with_tensor_values(mode: str, expected: list[float]) -> None:
    s = PrioritizedSampler(10, alpha=0.7, beta=torch.tensor(0.8, dtype=torch.float64))
    gamma = 0.5 if mode == "multiplicative" else -0.1
    sch = StepScheduler(s, "beta", gamma=gamma, n_steps=1, mode=mode, min_value=0.2,
                        max_value=0.75)
    got = []
    for _ in range(3):
        sch.step()
        assert isinstance(s.beta, torch.Tensor) and s.beta.dtype == torch.float64
        got.append(s.beta.item())
    assert got == pytest.approx(expected)
    sch2 = StepScheduler(PrioritizedSampler(10, alpha=0.7, beta=torch.tensor(0.5)), "beta",
                         gamma=2.0)
    sch2.load_state_dict(sch.state_dict())
    assert sch2.step_count == 3 and isinstance(sch2.initial_value, torch.Tensor)


def test_lambda_scheduler_and_list_rollback_with_tensors() -> None:
    s = PrioritizedSampler(10, alpha=torch.tensor(0.8), beta=torch.tensor(0.5))
    lam = LambdaScheduler(s, "beta", lambda n: 1 + n / 10, max_value=1.0)
    lam.step()
    assert isinstance(s.beta, torch.Tensor) and s.beta.item() == pytest.approx(0.55)
    bad = StepScheduler(s, "alpha", gamma=-1.0, mode="additive")  # alpha -0.2: refused
    with pytest.raises(ValueError, match="alpha"):
        SchedulerList([lam, bad]).step()
    assert lam.step_count == 1 and isinstance(s.beta, torch.Tensor)
    assert s.beta.item() == pytest.approx(0.55)
    assert isinstance(s.alpha, torch.Tensor) and s.alpha.item() == pytest.approx(0.8)


def test_buffers_and_slice_sampler_keep_tensors() -> None:
    rb = TensorDictPrioritizedReplayBuffer(alpha=torch.tensor(1.0), beta=torch.tensor(0.1),
                                           storage=LazyTensorStorage(10))
    assert isinstance(rb.sampler.alpha, torch.Tensor) and rb.sampler.beta.item() == \
        pytest.approx(0.1)
    pss = PrioritizedSliceSampler(10, alpha=torch.tensor(0.7), beta=torch.tensor(0.5),
                                  slice_len=2)
    assert isinstance(pss.beta, torch.Tensor) and pss.beta.item() == 0.5
    assert isinstance(pss.state_dict(), dict)
