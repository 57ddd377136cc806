"""A large prioritized draw or update on numba trees split over threads gives what one call gives:
the same slots, weights and generations, and trees equal bit for bit; a refused split update
writes nothing."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tdreplay.core import ListStorage
from tdreplay.samplers import PrioritizedSampler, _priority_kernels
from tdreplay.samplers._host_threads import MIN_ITEMS_PER_THREAD
from tdreplay.samplers._priority_split import NODES_PER_PART, SubtreeSplit
from tdreplay.samplers.segment_trees import TreeLayout

BATCH = 3 * MIN_ITEMS_PER_THREAD + 5  # three parts with three threads or more


class Parts:
    """``parts(k)``: cut large calls into ``k`` parts from now on, whatever torch's thread count
    (which also changes torch's own float results in the last bit: ``pow`` on the host);
    ``parts.split_updates``: how many updates ran split."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.monkeypatch = monkeypatch
        self.split_updates = 0
        real = _priority_kernels.split_update

        def counted(*args: object) -> object:
            self.split_updates += 1
            return real(*args)

        monkeypatch.setattr(_priority_kernels, "split_update", counted)

    def __call__(self, k: int) -> None:
        self.monkeypatch.setattr(_priority_kernels, "thread_count", lambda n: k)


@pytest.fixture
def parts(monkeypatch: pytest.MonkeyPatch) -> Parts:
    return Parts(monkeypatch)


def filled_sampler(capacity: int, written: int, **kwargs: object
                   ) -> tuple[PrioritizedSampler, ListStorage]:
    """A numba-tree sampler whose first ``written`` slots have random priorities."""
    storage = ListStorage(capacity)
    storage.set(torch.arange(written), list(range(written)))
    sampler = PrioritizedSampler(capacity, alpha=0.7, beta=0.5, backend="numba", **kwargs)
    sampler.extend(torch.arange(written))
    priority = torch.rand(written, generator=torch.Generator().manual_seed(1)) + 0.01
    sampler.update_priority(torch.arange(written), priority, storage=storage)
    return sampler, storage


def trees(sampler: PrioritizedSampler) -> list[np.ndarray]:
    """Copies of the sampler's node arrays: sum, min (and max) trees, and generations."""
    state = sampler._state
    arrays = [state.sum_tree.nodes, state.min_tree.nodes, state.host_generation]
    if state.max_tree is not None:
        arrays.append(state.max_tree.nodes)
    return [a.copy() for a in arrays]


@pytest.mark.parametrize("stratified", [False, True])
def test_draws_are_the_same_with_one_thread_or_several(torch_threads, stratified):
    sampler, storage = filled_sampler(50_000, 50_000, stratified=stratified)
    draws = []
    for threads in (1, 3):
        torch.set_num_threads(threads)
        sampler.set_rng(torch.Generator().manual_seed(0))
        index, info = sampler.sample(storage, BATCH)
        draws.append((index, info["priority_weight"], info["write_generation"]))
    (index_1, weight_1, gen_1), (index_3, weight_3, gen_3) = draws
    assert torch.equal(index_1, index_3)
    assert torch.equal(weight_1, weight_3)
    assert torch.equal(gen_1, gen_3)
    assert index_1.shape == (BATCH,) and weight_1.dtype == torch.float32
    # the draws are the sampler's: priorities of the slots drawn give the weights
    p = sampler.state_dict()["priorities"].double()
    expected = (p[index_1] / p[:50_000].min()) ** -0.5
    torch.testing.assert_close(weight_1.double(), expected, rtol=1e-5, atol=0)
    if stratified:  # draw i still falls in stratum i: the slots rise with i
        assert bool((index_1[1:] >= index_1[:-1]).all())


def an_update(written: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Slots and priorities of an update of ``BATCH`` entries: some ``-1``, some duplicates."""
    g = torch.Generator().manual_seed(seed)
    index = torch.randint(0, written, (BATCH,), generator=g)
    index[:7] = -1
    index[100:140] = index[3000]  # duplicates: the last one in batch order wins
    return index, torch.rand(BATCH, generator=g) * 5


@pytest.mark.parametrize(("capacity", "written", "within_buffer"), [
    (200_000, 200_000, False),
    (200_000, 200_000, True),  # a max tree too
    (1_000_000, 150_000, False),  # the parts split the written slots, not the capacity
    (40_000, 40_000, True),  # a small tree: fewer nodes at the split level
])
def test_updates_leave_the_same_trees_in_one_part_or_several(parts, capacity, written,
                                                              within_buffer):
    results = []
    for k in (1, 4):
        parts(k)
        sampler, storage = filled_sampler(capacity, written,
                                          max_priority_within_buffer=within_buffer)
        for seed in range(3):
            index, priority = an_update(written, seed)
            sampler.update_priority(index, priority, storage=storage)
        results.append((trees(sampler), sampler.max_priority))
    assert parts.split_updates == 4  # the fill and three updates, with 4 parts
    (trees_1, max_1), (trees_4, max_4) = results
    for one, split in zip(trees_1, trees_4):
        assert np.array_equal(one, split)
    assert max_1 == max_4
    # and the trees hold what was written: the last priority given to a slot
    sampler.update_priority(torch.tensor([5]), torch.tensor([2.0]), storage=storage)
    assert sampler.state_dict()["priorities"][5].item() == pytest.approx((2.0 + 1e-8) ** 0.7)


def test_a_split_update_skips_stale_entries_as_one_call_does(parts):
    results = []
    for k in (1, 4):
        parts(k)
        sampler, storage = filled_sampler(100_000, 100_000)
        sampler.set_rng(torch.Generator().manual_seed(0))
        index, info = sampler.sample(storage, BATCH)
        sampler.extend(torch.arange(0, 100_000, 2))  # even slots rewritten: their entries stale
        sampler.update_priority(index, torch.full((BATCH,), 9.0), storage=storage,
                                write_generation=info["write_generation"])
        results.append(trees(sampler))
        assert parts.split_updates == (k > 1) * 2  # the fill and the update
        leaves = sampler.state_dict()["priorities"]
        odd = index[index % 2 == 1]
        assert bool((leaves[odd] == (9.0 + 1e-8) ** 0.7).all())
        assert not bool((leaves[index[index % 2 == 0]] == (9.0 + 1e-8) ** 0.7).any())
    for one, split in zip(*results):
        assert np.array_equal(one, split)


@pytest.mark.parametrize("bad", ["nan", "unwritten", "out_of_range"])
def test_a_refused_split_update_changes_nothing(parts, bad):
    parts(4)
    sampler, storage = filled_sampler(200_000, 150_000)
    before = trees(sampler)
    assert parts.split_updates == 1  # the fill
    index, priority = an_update(150_000, 0)
    if bad == "nan":
        priority[-1] = float("nan")
    else:
        index[-1] = 170_000 if bad == "unwritten" else 200_000
    with pytest.raises((ValueError, IndexError)):
        sampler.update_priority(index, priority, storage=storage)
    for array, kept in zip(trees(sampler), before):
        assert np.array_equal(array, kept)
    assert parts.split_updates == 2  # the kernel refused it


def test_the_split_level_has_enough_nodes_per_part_over_the_written_slots():
    offsets = np.asarray(TreeLayout(10_000_000).offsets)
    split = SubtreeSplit.plan(offsets, 10_000_000, 8)
    assert split is not None
    assert split.nodes == -(-10_000_000 // split.span) >= NODES_PER_PART * 8
    # the level above has too few: the split is as high as it can be
    assert -(-10_000_000 // (split.span * 8)) < NODES_PER_PART * 8
    ranges = split.node_ranges()
    assert ranges[0][0] == 0 and ranges[-1][1] == split.nodes
    assert all(stop == start for (_, stop), (start, _) in zip(ranges, ranges[1:]))
    # fewer written slots: a lower level, fewer nodes
    low = SubtreeSplit.plan(offsets, 300_000, 8)
    assert low is not None and low.span < split.span
    assert SubtreeSplit.plan(np.asarray(TreeLayout(64).offsets), 64, 2) is None
