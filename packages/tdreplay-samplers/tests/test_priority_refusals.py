"""Priority updates refused before any change (issue 18 items 6, 7): finite priorities that
overflow once raised to ``alpha``, shapes that neither match nor broadcast, object arrays. Every
test runs with the numba trees, the torch trees checked on the host, and the torch trees that
check on the device (``validate=False``: a bad update changes nothing, with no error)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ListStorage, TensorDictReplayBuffer
from tdreplay.samplers import PrioritizedSampler
from tdreplay.storages import LazyTensorStorage

CHECKED = [("numba", None), ("torch", True)]
ALL = [*CHECKED, ("torch", False)]


def make(backend: str, validate: bool | None, *, alpha: float = 2.0, capacity: int = 8,
         n: int = 6) -> tuple[PrioritizedSampler, ListStorage]:
    sampler = PrioritizedSampler(capacity, alpha=alpha, beta=1.0, eps=0.0, backend=backend,
                                 validate=validate)
    storage = ListStorage(capacity)
    storage.set(torch.arange(n), list(range(n)))
    sampler.extend(torch.arange(n))
    sampler.update_priority(torch.arange(n), torch.arange(1.0, n + 1.0), storage=storage)
    return sampler, storage


def snapshot(sampler: PrioritizedSampler) -> dict:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v
            for k, v in sampler.state_dict().items()}


def assert_unchanged(sampler: PrioritizedSampler, before: dict) -> None:
    after = sampler.state_dict()
    assert after.keys() == before.keys()
    for key, value in before.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(after[key], value), key
        else:
            assert after[key] == value, key


@pytest.mark.parametrize(("backend", "validate"), CHECKED)
@pytest.mark.parametrize("priority", [1e200, 1.4e154, 1e300])
def test_priority_that_overflows_after_alpha_is_refused(backend, validate, priority):
    sampler, storage = make(backend, validate)
    before = snapshot(sampler)
    with pytest.raises(ValueError, match=r"priority \[.*e\+(200|154|300)\] overflows"):
        sampler.update_priority(torch.tensor([0, 1]), torch.tensor([2.0, priority],
                                                                   dtype=torch.float64),
                                storage=storage)
    assert_unchanged(sampler, before)
    assert math.isfinite(sampler.total_priority) and sampler.max_priority == 6.0


@pytest.mark.parametrize(("backend", "validate"), ALL)
def test_largest_priority_that_fits_is_stored_and_the_sum_stays_finite(backend, validate):
    sampler, storage = make(backend, validate, alpha=1.0)
    limit = float(np.finfo(np.float64).max) / 8
    sampler.update_priority(torch.arange(6), torch.full((6,), limit, dtype=torch.float64),
                            storage=storage)
    assert sampler.state_dict()["priorities"][:6].tolist() == [limit] * 6
    assert math.isfinite(sampler.total_priority)


def test_unchecked_device_style_update_drops_an_overflowing_update():
    sampler, storage = make("torch", False)
    before = snapshot(sampler)
    sampler.update_priority(torch.tensor([0, 1]), torch.tensor([2.0, 1e200],
                                                               dtype=torch.float64))
    assert_unchanged(sampler, before)


@pytest.mark.parametrize(("backend", "validate"), CHECKED)
def test_summed_trailing_priorities_that_overflow_are_refused(backend, validate):
    sampler = PrioritizedSampler(4, alpha=1.0, beta=1.0, eps=0.0, reduction="sum",
                                 backend=backend, validate=validate)
    sampler.extend(torch.arange(4))
    before = snapshot(sampler)
    with pytest.raises(ValueError, match="overflows"):  # each finite, their sum is not
        sampler.update_priority(torch.tensor([0]), torch.tensor([[1e308, 1e308]],
                                                                dtype=torch.float64))
    assert_unchanged(sampler, before)


@pytest.mark.parametrize(("backend", "validate"), CHECKED)
def test_raising_alpha_after_a_large_priority_keeps_new_items_finite(backend, validate):
    sampler, storage = make(backend, validate, alpha=1.0)
    sampler.update_priority(torch.tensor([0]), torch.tensor([1e200], dtype=torch.float64))
    sampler.alpha = 2.0  # the max priority 1e200 would give new items (1e200) ** 2 = inf
    sampler.extend(torch.tensor([6]))
    assert math.isfinite(sampler.total_priority)
    assert sampler.state_dict()["priorities"][6] == float(np.finfo(np.float64).max) / 8


@pytest.mark.parametrize(("backend", "validate"), CHECKED)
def test_buffer_refuses_overflowing_priorities_in_the_data_before_writing(backend, validate):
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(8), batch_size=2,
        sampler=PrioritizedSampler(8, alpha=2.0, beta=1.0, backend=backend, validate=validate))
    rb.extend(TensorDict({"x": torch.zeros(2)}, [2]))
    data = TensorDict({"x": torch.ones(2),
                       "td_error": torch.tensor([1.0, 1e200], dtype=torch.float64)}, [2])
    with pytest.raises(ValueError, match=r"priority \[1e\+200\] overflows"):
        rb.extend(data)
    assert len(rb) == 2 and rb.sampler.max_priority == 1.0


def test_buffer_refuses_a_priority_entry_that_is_no_tensor_naming_it():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8), batch_size=2,
                                sampler=PrioritizedSampler(8, alpha=0.7, beta=0.5))
    rb.extend(TensorDict({"x": torch.zeros(2), "td_error": torch.ones(2)}, [2]))
    text = TensorDict({"x": torch.ones(2)}, [2])
    text.set_non_tensor("td_error", "high")
    nested = TensorDict({"x": torch.ones(2), "td_error": {"a": torch.ones(2)}}, [2])
    for data in (text, nested):
        with pytest.raises(TypeError, match="priority entry 'td_error' must be a tensor"):
            rb.extend(data)
    assert len(rb) == 2


def test_priorities_of_items_with_no_value_are_refused_naming_priority():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8, ndim=2), batch_size=2,
                                sampler=PrioritizedSampler(8, alpha=0.7, beta=0.5))
    rb.extend(TensorDict({"x": torch.zeros(2, 2), "td_error": torch.ones(2, 2)}, [2, 2]))
    with pytest.raises(ValueError, match=r"priority of shape \(2, 0\) holds no value"):
        rb.extend(TensorDict({"x": torch.zeros(2, 0), "td_error": torch.ones(2, 0)}, [2, 0]))
    assert len(rb) == 4


@pytest.mark.parametrize(("backend", "validate"), ALL)
@pytest.mark.parametrize(("index_shape", "priority_shape"),
                         [((2, 3), (3, 2)), ((6,), (2, 3)), ((2, 3), (6,)), ((2, 3), (3, 1)),
                          ((4,), (2, 2)), ((2, 2), (4, 1))])
def test_shapes_that_neither_match_nor_broadcast_are_refused(backend, validate, index_shape,
                                                              priority_shape):
    sampler, storage = make(backend, validate, n=8)
    before = snapshot(sampler)
    index = torch.arange(math.prod(index_shape)).reshape(index_shape)
    with pytest.raises(ValueError, match=r"priority of shape .* does not match index of shape"):
        sampler.update_priority(index, torch.ones(priority_shape), storage=storage)
    assert_unchanged(sampler, before)


@pytest.mark.parametrize(("backend", "validate"), ALL)
@pytest.mark.parametrize(("priority", "expected"), [
    (torch.tensor(5.0), [5.0] * 6),                                     # scalar: every index
    (torch.tensor([1.0, 2.0, 3.0]), [1.0, 2.0, 3.0] * 2),               # broadcasts over rows
    (torch.tensor([[1.0], [2.0]]), [1.0] * 3 + [2.0] * 3),              # broadcasts over cols
    (torch.tensor([1.0, 2.0]), [1.0] * 3 + [2.0] * 3),                  # one per slice
    (torch.arange(1.0, 7.0).reshape(2, 3, 1), [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),  # trailing
    (torch.arange(1.0, 7.0).reshape(1, 2, 3), [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),  # size-1 dims
])
def test_shapes_that_match_or_broadcast_pair_as_expected(backend, validate, priority, expected):
    sampler, storage = make(backend, validate, alpha=1.0)
    sampler.update_priority(torch.arange(6).reshape(2, 3), priority, storage=storage)
    assert sampler.state_dict()["priorities"][:6].tolist() == expected


@pytest.mark.parametrize(("backend", "validate"), ALL)
def test_one_priority_per_slice_of_a_square_index_goes_to_its_row(backend, validate):
    """``[B]`` for an index of ``[B, T]`` with ``B == T``: before, it broadcast along ``T``
    (slice 0 got the value of every slice's first step), as it never could when ``B != T``."""
    sampler, storage = make(backend, validate, alpha=1.0, capacity=9, n=9)
    sampler.update_priority(torch.arange(9).reshape(3, 3), torch.tensor([1.0, 2.0, 3.0]),
                            storage=storage)
    assert sampler.state_dict()["priorities"][:9].tolist() == [1.0] * 3 + [2.0] * 3 + [3.0] * 3


@pytest.mark.parametrize(("backend", "validate"), ALL)
@pytest.mark.parametrize("priority", [np.array([1.0, None], dtype=object),
                                      np.array(["1.0", "2.0"]), np.array([1 + 1j, 2j])])
def test_non_real_numpy_priorities_are_refused_naming_priority(backend, validate, priority):
    sampler, storage = make(backend, validate)
    before = snapshot(sampler)
    with pytest.raises(TypeError, match="priority must hold real numbers"):
        sampler.update_priority(torch.tensor([0, 1]), priority, storage=storage)
    with pytest.raises(TypeError, match="priority"):
        sampler.check_priority(priority)
    assert_unchanged(sampler, before)


@pytest.mark.parametrize(("backend", "validate"), CHECKED)
@pytest.mark.parametrize("max_priority", [-5.0, -1e-300])
def test_state_with_a_negative_max_priority_is_refused(backend, validate, max_priority):
    """A negative max priority loaded before: every later write got it as its priority and
    every sample raised (no written slot had a priority)."""
    source, _ = make(backend, validate)
    state = source.state_dict()
    state["max_priority"] = max_priority
    sampler, _ = make(backend, validate)
    before = snapshot(sampler)
    with pytest.raises(ValueError, match=r"'max_priority'\] must be a float >= 0 \(-inf before"):
        sampler.load_state_dict(state)
    assert_unchanged(sampler, before)
    state["max_priority"] = -math.inf  # no priority set yet: new items get the default, 1
    sampler.load_state_dict(state)
    assert sampler.max_priority == 1.0
