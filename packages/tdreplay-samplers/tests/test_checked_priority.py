"""Priorities checked before a write are not converted again by the update after it (issue 19):
``PrioritizedSampler.check_priority`` returns the values as the numba update kernel takes them
(``HostPriority``), and an update with them leaves exactly the trees an update with the values
given leaves. Values checked under other settings, or for other items, are converted again."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ListStorage
from tdreplay.samplers import PrioritizedSampler, TensorDictPrioritizedReplayBuffer
from tdreplay.samplers._priority_values import HostPriority, leaf_limit
from tdreplay.storages import LazyTensorStorage

CAPACITY = 8


def make(*, alpha: float = 0.7, reduction: str = "max", backend: str = "numba",
         n: int = 6) -> tuple[PrioritizedSampler, ListStorage]:
    sampler = PrioritizedSampler(CAPACITY, alpha=alpha, beta=0.5, eps=1e-3, backend=backend,
                                 reduction=reduction)
    storage = ListStorage(CAPACITY)
    storage.set(torch.arange(n), list(range(n)))
    sampler.extend(torch.arange(n))
    return sampler, storage


def state(sampler: PrioritizedSampler) -> dict:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v
            for k, v in sampler.state_dict().items()}


def assert_same_state(a: PrioritizedSampler, b: PrioritizedSampler) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        if isinstance(sa[key], torch.Tensor):
            assert torch.equal(sa[key], sb[key]), key
        else:
            assert sa[key] == sb[key], key
    assert a.total_priority == b.total_priority
    assert a.min_priority == b.min_priority
    assert a.max_priority == b.max_priority


@pytest.mark.parametrize(("index", "priority", "reduction"), [
    (torch.arange(6), torch.tensor([0.5, 2.0, 1e-9, 0.0, 3.0, 7.0]), "max"),
    (torch.arange(6), torch.tensor([0.5, 2.0, 1e-9, 0.0, 3.0, 7.0], dtype=torch.float64), "max"),
    (torch.arange(6), torch.tensor([1, 2, 3, 4, 5, 6]), "max"),
    (torch.tensor([4, 1, 4]), torch.tensor([0.25, 8.0, 2.5]), "max"),  # repeats: last wins
    (torch.arange(3), torch.arange(12.0).reshape(3, 4), "max"),
    (torch.arange(3), torch.arange(12.0).reshape(3, 4), "mean"),
    (torch.arange(3), torch.arange(12.0).reshape(3, 4), "sum"),
    (torch.arange(3), torch.arange(12.0).reshape(3, 4), "median"),
    (torch.arange(3), torch.arange(12.0).reshape(3, 4) + 1, "min"),
    (torch.tensor([2]), torch.tensor(4.5), "max"),  # a scalar for one item
])
def test_an_update_with_checked_values_equals_one_with_the_values(index, priority, reduction):
    checked_sampler, storage = make(reduction=reduction)
    plain_sampler, _ = make(reduction=reduction)
    checked = checked_sampler.check_priority(priority)
    assert isinstance(checked, HostPriority)
    assert checked.raw.dtype == checked.reduced.dtype == checked.leaf.dtype == torch.float64
    checked_sampler.update_priority(index, checked, storage=storage)
    plain_sampler.update_priority(index, priority, storage=storage)
    assert_same_state(checked_sampler, plain_sampler)
    torch.manual_seed(0)
    np.random.seed(0)
    drawn = checked_sampler.sample(storage, 64)
    torch.manual_seed(0)
    np.random.seed(0)
    expected = plain_sampler.sample(storage, 64)
    assert torch.equal(drawn[0], expected[0])
    assert torch.equal(drawn[1]["priority_weight"], expected[1]["priority_weight"])


def test_values_checked_before_an_alpha_change_are_stored_with_the_new_alpha():
    sampler, storage = make(alpha=0.5)
    expected, _ = make(alpha=0.5)
    checked = sampler.check_priority(torch.tensor([4.0, 9.0]))
    sampler.alpha = 2.0
    expected.alpha = 2.0
    sampler.update_priority(torch.tensor([0, 1]), checked, storage=storage)
    expected.update_priority(torch.tensor([0, 1]), torch.tensor([4.0, 9.0]), storage=storage)
    assert_same_state(sampler, expected)
    stored = sampler.state_dict()["priorities"][:2]
    assert stored.tolist() == pytest.approx([(4.0 + 1e-3) ** 2, (9.0 + 1e-3) ** 2])


def test_values_checked_as_rows_apply_to_the_slots_of_a_two_dim_index():
    # checked as 2 rows of 3 (reduced to 2 values), then updating 6 slots: one each
    sampler, storage = make()
    expected, _ = make()
    values = torch.arange(1.0, 7.0).reshape(2, 3)
    checked = sampler.check_priority(values)
    assert checked.reduced.shape == (2,)
    sampler.update_priority(torch.arange(6).reshape(2, 3), checked, storage=storage)
    expected.update_priority(torch.arange(6).reshape(2, 3), values, storage=storage)
    assert_same_state(sampler, expected)
    assert sampler.state_dict()["priorities"][:6].tolist() == pytest.approx(
        [(v + 1e-3) ** 0.7 for v in range(1, 7)])


@pytest.mark.parametrize("bad", [float("nan"), -1.0, math.inf, -math.inf])
def test_a_check_refuses_what_an_update_refuses(bad):
    sampler, storage = make()
    before = state(sampler)
    with pytest.raises(ValueError, match=r"priority must be finite and >= 0"):
        sampler.check_priority(torch.tensor([1.0, bad]))
    with pytest.raises(ValueError, match=r"priority must be finite and >= 0"):
        sampler.update_priority(torch.tensor([0, 1]), torch.tensor([1.0, bad]), storage=storage)
    after = sampler.state_dict()
    assert all(torch.equal(v, after[k]) if isinstance(v, torch.Tensor) else v == after[k]
               for k, v in before.items())


def test_the_check_and_the_update_agree_at_the_overflow_limit():
    # values whose stored value (v + eps) ** alpha lies just below and just above the limit
    alpha, eps = 2.0, 1e-3
    limit_value = math.sqrt(leaf_limit(CAPACITY)) - eps
    for factor in (0.999999, 0.9999999999, 1.0, 1.0000000001, 1.000001):
        value = torch.tensor([limit_value * factor], dtype=torch.float64)
        sampler, storage = make(alpha=alpha)
        try:
            checked = sampler.check_priority(value)
        except ValueError as err:
            assert "overflows" in str(err)
            with pytest.raises(ValueError, match="overflows"):
                sampler.update_priority(torch.tensor([0]), value, storage=storage)
            continue
        sampler.update_priority(torch.tensor([0]), checked, storage=storage)
        assert sampler.state_dict()["priorities"][0].item() <= leaf_limit(CAPACITY)


def test_torch_trees_get_the_values_back_as_given():
    sampler, storage = make(backend="torch")
    values = torch.tensor([0.5, 2.0])
    returned = sampler.check_priority(values)
    assert not isinstance(returned, HostPriority) and torch.equal(returned, values)
    expected, _ = make(backend="torch")
    sampler.update_priority(torch.tensor([0, 1]), sampler.check_priority(values), storage=storage)
    expected.update_priority(torch.tensor([0, 1]), values, storage=storage)
    assert_same_state(sampler, expected)


def test_a_td_buffer_stores_the_priorities_its_batch_brings():
    rb = TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5, eps=1e-3,
                                           storage=LazyTensorStorage(CAPACITY))
    errors = torch.tensor([0.5, 3.0, 1.5])
    rb.extend(TensorDict({"obs": torch.arange(3.0), "td_error": errors}, [3]))
    stored = rb.sampler.state_dict()["priorities"][:3]
    assert stored.tolist() == pytest.approx(((errors.double() + 1e-3) ** 0.7).tolist())
    with pytest.raises(ValueError, match="priority must be finite"):
        rb.extend(TensorDict({"obs": torch.arange(2.0),
                              "td_error": torch.tensor([1.0, float("nan")])}, [2]))
    assert len(rb) == 3
    assert rb.sampler.state_dict()["priorities"][:3].tolist() == stored.tolist()
