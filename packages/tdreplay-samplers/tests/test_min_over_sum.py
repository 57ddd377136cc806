"""The prioritized sampler's min tree without leaves of its own (issue 19): its bottom nodes
read the sum tree's leaves. The minimum stays exact through every change, both backends hold
the same nodes and draw the same, and states pickled with a full min tree still load."""

from __future__ import annotations

import math
import pathlib
import pickle

import numpy as np
import pytest
import torch

from tdreplay.core import ListStorage
from tdreplay.samplers import PrioritizedSampler
from tdreplay.samplers.segment_trees import (
    MinOverSumTree,
    NumbaMinOverSumTree,
    TorchMinOverSumTree,
    make_min_over_sum,
    make_min_tree,
    make_sum_tree,
)

BACKENDS = ("numba", "torch")
FIXTURE = pathlib.Path(__file__).parent / "data" / "prioritized_full_min_tree.pkl"


def _host(x) -> np.ndarray:
    return x.cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def _positive_min(values: np.ndarray) -> float:
    positive = values[values > 0]
    return float(positive.min()) if positive.size else math.inf


# ---- the tree ---------------------------------------------------------------------------------
@pytest.mark.parametrize("capacity", [1, 7, 8, 9, 64, 65, 513, 1000, 4097])
def test_min_follows_raising_lowering_and_emptying_leaves_on_both_backends(capacity):
    rng = np.random.default_rng(capacity)
    sums = {b: make_sum_tree(capacity, backend=b) for b in BACKENDS}
    mins = {b: make_min_over_sum(sums[b]) for b in BACKENDS}
    reference = make_min_tree(capacity)  # a full min tree of the positive leaves
    leaves = np.zeros(capacity)
    for step in range(40):
        n = int(rng.integers(1, 2 * capacity + 2))
        index = rng.integers(0, capacity, n)
        values = rng.random(n) * 10 + 1e-3
        if step % 3 == 1:  # lower the current minimum, or raise it
            where = int(np.argmin(np.where(leaves > 0, leaves, np.inf)))
            index[0] = where
            values[0] = leaves[where] / 4 if step % 2 else leaves[where] + 100
        if step % 5 == 2:
            values[: n // 2] = 0.0  # emptied leaves are no candidates
        for b in BACKENDS:
            sums[b].update(index, values)
            mins[b].refresh(index)
        for i, v in zip(index, values, strict=True):  # the last duplicate wins
            leaves[i] = v
        reference.update(np.arange(capacity), np.where(leaves > 0, leaves, np.inf))
        expected = _positive_min(leaves)
        assert reference.min() == expected
        for b in BACKENDS:
            assert float(mins[b].min()) == expected
        assert np.array_equal(_host(mins["numba"].nodes), _host(mins["torch"].nodes))
        # the nodes hold the internal levels of a full min tree, bit for bit
        assert np.array_equal(mins["numba"].nodes,
                              reference.nodes[: reference.layout.leaf_offset])


@pytest.mark.parametrize("backend", BACKENDS)
def test_rebuild_equals_incremental_refreshes_and_holds_no_leaves(backend):
    sums = make_sum_tree(3000, backend=backend)
    mins = make_min_over_sum(sums)
    rng = np.random.default_rng(0)
    for _ in range(20):
        index = rng.integers(0, 3000, 50)
        sums.update(index, rng.random(50) + 0.5)
        mins.refresh(index)
    incremental = _host(mins.nodes).copy()
    mins.rebuild()
    assert np.array_equal(_host(mins.nodes), incremental)
    assert mins.nodes.shape[0] == sums.layout.leaf_offset < sums.nodes.shape[0] // 7
    assert isinstance(mins, MinOverSumTree) and len(mins) == 3000
    assert type(mins) is (NumbaMinOverSumTree if backend == "numba" else TorchMinOverSumTree)


def test_refresh_checks_its_indices():
    for sums in (make_sum_tree(10), make_sum_tree(10, backend="torch")):
        mins = make_min_over_sum(sums)
        with pytest.raises(IndexError, match="capacity=10"):
            mins.refresh(np.array([3, 10]))
        with pytest.raises(TypeError, match="integers"):
            mins.refresh(np.array([1.0]))
    # unchecked device-style trees ignore what is out of range, changing nothing
    sums = make_sum_tree(10, backend="torch", validate=False)
    mins = make_min_over_sum(sums)
    sums.update(torch.tensor([4]), torch.tensor([2.0]))
    mins.refresh(torch.tensor([4, -1, 99]))
    assert float(mins.min()) == 2.0
    with pytest.raises(TypeError, match="NumbaSumTree or a TorchSumTree"):
        make_min_over_sum(make_min_tree(4))
    with pytest.raises(TypeError, match="numba SumTree"):
        NumbaMinOverSumTree(make_sum_tree(4, backend="torch"))


# ---- the sampler ------------------------------------------------------------------------------
def _sampler(backend: str, capacity: int = 50) -> tuple[PrioritizedSampler, ListStorage]:
    storage = ListStorage(capacity)
    storage.set(torch.arange(capacity), list(range(capacity)))
    return PrioritizedSampler(capacity, alpha=0.8, beta=0.4, backend=backend), storage


def _stored(sampler: PrioritizedSampler) -> np.ndarray:
    return sampler.state_dict()["priorities"].numpy()


@pytest.mark.parametrize("backend", BACKENDS)
def test_min_priority_is_exact_through_updates_extend_and_empty(backend):
    sampler, storage = _sampler(backend)
    assert sampler.min_priority == math.inf
    sampler.extend(torch.arange(20))
    assert sampler.min_priority == _positive_min(_stored(sampler)) == (1 + sampler.eps) ** 0.8
    g = torch.Generator().manual_seed(0)
    sampler.update_priority(torch.arange(20), torch.rand(20, generator=g) + 0.5)
    assert sampler.min_priority == _positive_min(_stored(sampler))
    least = int(np.argmin(np.where(_stored(sampler) > 0, _stored(sampler), np.inf)))
    sampler.update_priority(torch.tensor([least]), torch.tensor([50.0]))  # raises the min
    raised = sampler.min_priority
    assert raised == _positive_min(_stored(sampler)) > (0.5 + sampler.eps) ** 0.8
    sampler.update_priority(torch.tensor([3]), torch.tensor([0.0]))  # lowers it
    assert sampler.min_priority == _positive_min(_stored(sampler)) == sampler.eps ** 0.8
    sampler.extend(torch.tensor([3]))  # rewritten at the max priority: the min rises again
    assert sampler.min_priority == _positive_min(_stored(sampler)) == raised
    sampler.empty()
    assert sampler.min_priority == math.inf
    sampler.extend(torch.arange(5))
    assert sampler.min_priority == _positive_min(_stored(sampler))


@pytest.mark.parametrize("backend", BACKENDS)
def test_weights_equal_the_brute_force_weights_and_excluded_keeps_the_min(backend):
    sampler, storage = _sampler(backend)
    sampler.extend(torch.arange(50))
    sampler.update_priority(torch.arange(50), torch.linspace(0.1, 9.0, 50))
    before = sampler.min_priority
    with sampler.excluded(torch.arange(5)):  # the least priorities cannot be drawn
        # recomputes the block of slots 0..7 while 0..4 read as empty
        sampler.update_priority(torch.tensor([6]), torch.tensor([4.0]))
        index, _ = sampler.sample(storage, 64)
        assert int(index.min()) >= 5
    # restored: slot 0 holds the least priority again
    assert sampler.min_priority == before == _positive_min(_stored(sampler)) == _stored(sampler)[0]
    sampler.set_rng(torch.Generator().manual_seed(4))
    index, info = sampler.sample(storage, 256)
    p = _stored(sampler)
    expected = (p[index.numpy()] / p[p > 0].min()) ** -0.4
    np.testing.assert_allclose(info["priority_weight"].double().numpy(), expected, rtol=1e-6)


def test_both_backends_draw_the_same_after_the_same_history():
    results = []
    for backend in BACKENDS:
        sampler, storage = _sampler(backend, 300)
        sampler.extend(torch.arange(300))
        g = torch.Generator().manual_seed(5)
        for _ in range(10):
            index = torch.randint(0, 300, (64,), generator=g)
            sampler.update_priority(index, torch.rand(64, generator=g) * 3)
        sampler.set_rng(torch.Generator().manual_seed(6))
        results.append((sampler.sample(storage, 512), sampler.min_priority))
    ((i_a, info_a), min_a), ((i_b, info_b), min_b) = results
    assert torch.equal(i_a, i_b) and min_a == min_b
    torch.testing.assert_close(info_a["priority_weight"], info_b["priority_weight"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_restored_and_pickled_samplers_keep_the_min_and_draw_the_same(backend):
    sampler, storage = _sampler(backend)
    sampler.extend(torch.arange(40))
    sampler.update_priority(torch.arange(40), torch.rand(40, generator=torch.Generator()
                                                         .manual_seed(7)) + 0.2)
    restored, _ = _sampler(backend)
    restored.load_state_dict(sampler.state_dict())
    copy = pickle.loads(pickle.dumps(sampler))
    assert isinstance(copy._state.min_tree, MinOverSumTree)
    assert copy._state.min_tree.sum_tree is copy._state.sum_tree
    draws, least = [], sampler.min_priority
    assert least == _positive_min(_stored(sampler))
    for s in (sampler, restored, copy):
        assert s.min_priority == least
        s.set_rng(torch.Generator().manual_seed(8))
        draws.append(s.sample(storage, 100))
        s.update_priority(torch.tensor([1]), torch.tensor([1e-3]))  # the copies stay live
        assert s.min_priority == _positive_min(_stored(s)) == _stored(s)[1]
    for index, info in draws[1:]:
        assert torch.equal(index, draws[0][0])
        assert torch.equal(info["priority_weight"], draws[0][1]["priority_weight"])


# ---- states saved before the change -----------------------------------------------------------
def test_samplers_pickled_with_a_full_min_tree_load_and_keep_working():
    """``data/prioritized_full_min_tree.pkl``: samplers pickled by the code before this change
    (their state holds a full ``MinTree``) and a ``state_dict``, written by
    ``data/make_full_min_tree_fixture.py``."""
    saved = pickle.loads(FIXTURE.read_bytes())
    storage = ListStorage(40)
    storage.set(torch.arange(40), list(range(40)))
    fresh = PrioritizedSampler(40, alpha=0.7, beta=0.6)
    fresh.load_state_dict(saved["state_dict"])
    assert fresh.min_priority == saved["numba_min"] == _positive_min(_stored(fresh))
    draws = []
    for backend in BACKENDS:
        old = pickle.loads(saved[backend])
        assert isinstance(old._state.min_tree, MinOverSumTree)
        assert old.min_priority == saved[f"{backend}_min"] == fresh.min_priority
        old.set_rng(torch.Generator().manual_seed(9))
        draws.append(old.sample(storage, 200)[0])
        old.update_priority(torch.tensor([7]), torch.tensor([2.0]))  # was the least
        assert old.min_priority == _positive_min(_stored(old)) > saved[f"{backend}_min"]
    fresh.set_rng(torch.Generator().manual_seed(9))
    assert torch.equal(draws[0], fresh.sample(storage, 200)[0])
    assert torch.equal(draws[0], draws[1])
