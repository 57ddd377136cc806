"""What ``PrioritizedSampler.extend`` stores for new items, alike on numba and torch trees: their
priority (leaf), the same float64 for the same max priority, alpha and eps (numba trees take it
from a cache of torch's value), and a write generation per extend, in the one kernel call."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tdreplay.samplers import PrioritizedSampler
from tdreplay.samplers._priority_values import leaf_limit, leaf_values

ALPHAS = [0.5, 0.6, 0.7, 1.0, 2.0, 3.0]
MAX_PRIORITIES = [None, 0.3, 7.5, 1e-300, 123456.789]


def _new_item_leaf(backend: str, alpha: float, max_priority: float | None, eps: float) -> float:
    sampler = PrioritizedSampler(8, alpha=alpha, beta=1.0, eps=eps, backend=backend)
    sampler.extend(torch.tensor([0]))
    if max_priority is not None:
        sampler.update_priority(torch.tensor([0]), torch.tensor([max_priority],
                                                                dtype=torch.float64))
    sampler.extend(torch.tensor([5]))  # a new item: the max priority set so far
    return float(sampler.state_dict()["priorities"][5])


@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("max_priority", MAX_PRIORITIES)
@pytest.mark.parametrize("eps", [0.0, 1e-8])
def test_numba_and_torch_trees_store_the_same_leaf(alpha, max_priority, eps):
    expected = leaf_values(torch.tensor(1.0 if max_priority is None else max_priority,
                                        dtype=torch.float64), alpha, eps)
    numba_leaf = _new_item_leaf("numba", alpha, max_priority, eps)
    assert numba_leaf == _new_item_leaf("torch", alpha, max_priority, eps) == float(expected)


@pytest.mark.parametrize("backend", ["numba", "torch"])
def test_a_leaf_that_overflows_is_capped_and_one_that_underflows_is_tiny(backend):
    sampler = PrioritizedSampler(8, alpha=1.0, beta=1.0, eps=0.0, backend=backend)
    sampler.extend(torch.tensor([0]))
    sampler.update_priority(torch.tensor([0]), torch.tensor([1e200], dtype=torch.float64))
    sampler.alpha = 2.0  # (1e200) ** 2 overflows float64: a new item's leaf is capped
    sampler.extend(torch.tensor([5]))
    assert float(sampler.state_dict()["priorities"][5]) == leaf_limit(8)
    # (1e-300) ** 3 underflows to 0: the smallest normal float, so the item can be drawn
    assert _new_item_leaf(backend, 3.0, 1e-300, 0.0) == float(np.finfo(np.float64).tiny)


@pytest.mark.parametrize("backend", ["numba", "torch"])
def test_new_items_follow_the_max_priority_as_it_changes(backend):
    sampler = PrioritizedSampler(8, alpha=0.7, beta=1.0, eps=0.0, backend=backend)
    sampler.extend(torch.tensor([0]))
    leaves = []
    for slot, priority in zip([1, 2, 3], [4.0, 9.0, 2.0]):  # the max: 4, 9, then still 9
        sampler.update_priority(torch.tensor([0]), torch.tensor([priority]))
        sampler.extend(torch.tensor([slot]))
        leaves.append(float(sampler.state_dict()["priorities"][slot]))
    assert leaves == [4.0 ** 0.7, 9.0 ** 0.7, 9.0 ** 0.7]


@pytest.mark.parametrize("backend", ["numba", "torch"])
def test_each_extend_stamps_its_slots_with_a_new_generation(backend):
    sampler = PrioritizedSampler(8, alpha=0.7, beta=1.0, backend=backend)
    sampler.extend(torch.tensor([0, 1, 2]))
    sampler.extend(torch.tensor([[5], [1]]))  # any shape: flat slots; slot 1 rewritten
    generations = sampler.slot_generation(torch.arange(8)).tolist()
    assert generations == [1, 2, 1, 0, 0, 2, 0, 0]  # 0: never written
    with pytest.raises(IndexError, match=r"slots must lie in \[0, 8\)"):
        sampler.extend(torch.tensor([3, -1]))  # refused: nothing stamped, no priority set
    assert sampler.slot_generation(torch.tensor([3])).tolist() == [0]
    assert float(sampler.state_dict()["priorities"][3]) == 0.0
    sampler.extend(torch.tensor([11]))  # beyond max_capacity: the trees grow (TorchRL's C++
    assert sampler.max_capacity == 16   # trees write past it)
    assert sampler.slot_generation(torch.tensor([11, 5])).tolist() == [3, 2]
