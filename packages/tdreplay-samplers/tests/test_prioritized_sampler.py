"""PrioritizedSampler on its own: distribution, weights, max priority, bad input, stale updates,
state. Every test runs with the numba trees and with the torch trees (on CPU)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tdreplay.core import ListStorage
from tdreplay.samplers import PrioritizedSampler
from tdreplay.storages import LazyTensorStorage, TensorStorage

BACKENDS = ["numba", "torch"]

# chi-square critical values at p = 1e-3 (the tests use fixed seeds: they are deterministic, the
# bound says the observed frequencies are what p ** alpha / sum predicts)
CHI2_CRIT_001 = {3: 16.27, 5: 20.52, 7: 24.32, 9: 27.88, 15: 37.70}


def storage_with(n: int, capacity: int | None = None) -> ListStorage:
    storage = ListStorage(capacity or n)
    storage.set(torch.arange(n), list(range(n)))
    return storage


def make(backend: str, capacity: int, n: int, **kwargs):
    """A sampler over a storage holding ``n`` written slots (told to the sampler)."""
    kwargs.setdefault("alpha", 1.0)
    kwargs.setdefault("beta", 1.0)
    sampler = PrioritizedSampler(capacity, backend=backend, **kwargs)
    storage = storage_with(n, capacity)
    sampler.extend(torch.arange(n))
    sampler.set_rng(torch.Generator().manual_seed(0))
    return sampler, storage


def leaves(sampler: PrioritizedSampler) -> torch.Tensor:
    return sampler.state_dict()["priorities"]


def frequencies(sampler, storage, draws: int, batch: int = 4096) -> torch.Tensor:
    counts = torch.zeros(sampler.max_capacity, dtype=torch.float64)
    for _ in range(draws // batch):
        index, _ = sampler.sample(storage, batch)
        counts += torch.bincount(index, minlength=sampler.max_capacity).double()
    return counts


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


# ---- construction ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"max_capacity": 0}, ValueError),
        ({"max_capacity": 2.5}, ValueError),
        ({"alpha": -0.1}, ValueError),
        ({"alpha": float("nan")}, ValueError),
        ({"beta": -1.0}, ValueError),
        ({"beta": "1"}, TypeError),
        ({"eps": -1e-8}, ValueError),
        ({"reduction": "prod"}, ValueError),
        ({"backend": "cupy"}, ValueError),
        ({"dtype": torch.long}, TypeError),
        ({"backend": "numba", "device": "cuda"}, ValueError),
        ({"validate": "yes"}, TypeError),
    ],
)
def test_bad_arguments(kwargs, error):
    args = {"max_capacity": 10, "alpha": 0.5, "beta": 0.5, **kwargs}
    with pytest.raises(error):
        PrioritizedSampler(**args)


def test_alpha_beta_setters_validate():
    sampler = PrioritizedSampler(4, alpha=0.5, beta=0.4)
    sampler.beta = 1.0
    assert sampler.beta == 1.0
    with pytest.raises(ValueError, match="beta"):
        sampler.beta = -1
    with pytest.raises(ValueError, match="alpha"):
        sampler.alpha = float("inf")
    with pytest.raises(ValueError, match="alpha must be greater or equal to 0"):  # TorchRL's words
        sampler.alpha = -1.0
    assert (sampler.alpha, sampler.beta) == (0.5, 1.0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_trees_follow_backend(backend):
    sampler, storage = make(backend, 8, 4)
    sampler.sample(storage, 2)
    assert sampler.backend == backend
    assert sampler.device == torch.device("cpu")


def test_default_placement_cpu_storage_is_numba():
    sampler = PrioritizedSampler(8, 0.5, 0.5)
    sampler.place_for(LazyTensorStorage(8))
    assert (sampler.backend, sampler.device) == ("numba", torch.device("cpu"))


# ---- distribution ----------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("alpha", [0.0, 0.7, 1.0])
def test_frequencies_follow_priorities(backend, alpha):
    n = 8
    sampler, storage = make(backend, 10, n, alpha=alpha)
    priority = torch.tensor([0.1, 0.5, 1.0, 2.0, 3.0, 0.25, 4.0, 1.5])
    sampler.update_priority(torch.arange(n), priority)
    counts = frequencies(sampler, storage, 200_704)
    assert counts[n:].sum() == 0  # unwritten slots are never drawn
    probs = (priority.double() + sampler.eps) ** alpha
    probs /= probs.sum()
    assert chi_square(counts[:n], probs) < CHI2_CRIT_001[n - 1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_stratified_frequencies_and_segments(backend):
    n = 6
    sampler, storage = make(backend, n, n, alpha=0.8, stratified=True)
    priority = torch.tensor([1.0, 5.0, 0.5, 2.0, 3.0, 0.2])
    sampler.update_priority(torch.arange(n), priority)
    index, _ = sampler.sample(storage, 64)
    # one draw per equal-mass segment, segments in order: the slots never go down
    assert bool((index[1:] >= index[:-1]).all())
    # and each slot gets its share of the 64 segments (to within one segment per boundary)
    probs = (priority.double() + sampler.eps) ** 0.8
    probs /= probs.sum()
    per_slot = torch.bincount(index, minlength=n).double()
    assert bool(((per_slot - 64 * probs).abs() <= 2).all())
    counts = frequencies(sampler, storage, 102_400, batch=1024)
    assert chi_square(counts, probs) < CHI2_CRIT_001[n - 1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_priority_items_are_rarely_but_possibly_drawn_with_eps(backend):
    sampler, storage = make(backend, 4, 4, alpha=1.0, eps=0.0)
    sampler.update_priority(torch.arange(4), torch.tensor([0.0, 1.0, 0.0, 1.0]))
    with pytest.warns(RuntimeWarning, match=r"priority 0 \(eps=0.0\).*weights .* are 0"):
        index, info = sampler.sample(storage, 4096)
    # a zero priority is stored as the smallest positive float64: drawing it is (almost) impossible
    assert set(index.tolist()) == {1, 3}
    assert bool(torch.isfinite(info["priority_weight"]).all())
    assert not info["priority_weight"].any()  # (1 / tiny) ** -1 underflows: what it warns of


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_weights_warn_once_and_only_when_they_are_zero(backend):
    # (TorchRL raises "non-positive p_min" there; the weights were all 0 without a word)
    import warnings

    sampler, storage = make(backend, 4, 4, alpha=1.0, beta=0.0, eps=0.0)
    sampler.update_priority(torch.arange(4), torch.tensor([0.0, 1.0, 0.0, 1.0]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, info = sampler.sample(storage, 8)  # beta=0: every weight is 1
        assert info["priority_weight"].tolist() == [1.0] * 8
        positive, storage2 = make(backend, 4, 4, alpha=1.0, beta=1.0, eps=0.0)
        positive.update_priority(torch.arange(4), torch.tensor([0.5, 1.0, 2.0, 1.0]))
        positive.sample(storage2, 8)
    sampler.beta = 1.0
    with pytest.warns(RuntimeWarning):
        sampler.sample(storage, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sampler.sample(storage, 8)  # once per sampler


# ---- weights ---------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("beta", [0.0, 0.4, 1.0])
def test_weights_are_normalised_is_weights(backend, beta):
    n = 5
    sampler, storage = make(backend, 8, n, alpha=0.6, beta=beta)
    priority = torch.tensor([0.5, 1.0, 2.0, 4.0, 8.0])
    sampler.update_priority(torch.arange(n), priority)
    index, info = sampler.sample(storage, 512)
    weight = info["priority_weight"]
    assert weight.dtype == torch.float32 and weight.shape == index.shape
    p = (priority.double() + sampler.eps) ** 0.6
    # PER: w_i = (N * P(i)) ** -beta / max_j w_j  ==  (p_i / p_min) ** -beta
    prob = p / p.sum()
    per = (n * prob) ** -beta
    expected = (per / per.max())[index]
    torch.testing.assert_close(weight.double(), expected, rtol=1e-6, atol=0)
    assert float(weight.max()) <= 1.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_weight_dtype_and_alpha_zero_gives_unit_weights(backend):
    sampler, storage = make(backend, 8, 8, alpha=0.0, beta=0.7, dtype=torch.float64)
    sampler.update_priority(torch.arange(8), torch.arange(8.0) * 3)
    _, info = sampler.sample(storage, 100)
    assert info["priority_weight"].dtype == torch.float64
    assert bool((info["priority_weight"] == 1).all())


# ---- max priority for new items --------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_new_items_get_running_max_priority(backend):
    sampler, _ = make(backend, 10, 2, alpha=1.0, eps=0.0)
    assert sampler.max_priority == 1.0
    torch.testing.assert_close(leaves(sampler)[:2], torch.ones(2, dtype=torch.float64))
    sampler.update_priority(torch.tensor([0, 1]), torch.tensor([0.5, 0.25]))
    assert sampler.max_priority == 0.5  # the first update sets it, as in TorchRL
    sampler.update_priority(torch.tensor([1]), torch.tensor([7.0]))
    sampler.update_priority(torch.tensor([1]), torch.tensor([0.1]))
    assert sampler.max_priority == 7.0  # the max since creation
    sampler.extend(torch.tensor([2, 3]))
    assert leaves(sampler)[2:4].tolist() == [7.0, 7.0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_max_priority_within_buffer(backend):
    sampler, _ = make(backend, 4, 3, alpha=1.0, eps=0.0, max_priority_within_buffer=True)
    sampler.update_priority(torch.tensor([0, 1, 2]), torch.tensor([2.0, 9.0, 3.0]))
    assert sampler.max_priority == 9.0
    sampler.update_priority(torch.tensor([1]), torch.tensor([1.0]))
    assert sampler.max_priority == 3.0  # the 9 is gone from the buffer
    sampler.extend(torch.tensor([2]))  # the 3 leaves first: the new item gets the max of the
    assert leaves(sampler)[2] == 2.0  # items still in the buffer
    assert sampler.max_priority == 2.0
    sampler.update_priority(torch.tensor([0]), torch.tensor([0.5]))
    assert sampler.max_priority == 2.0  # the new item holds 2 (it counted for nothing before)
    sampler.extend(torch.tensor([3]))
    assert leaves(sampler)[3] == 2.0
    sampler.empty()
    assert sampler.max_priority == 1.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_max_priority_within_buffer_counts_the_items_holding_the_default(backend):
    # 500 warm-up items at the default 1, one learner update of 32 of them to 0.01: the 100
    # new items got 0.01 (only priorities set by updates counted), 0.3% of the draws instead
    # of the 17.6% TorchRL gives them
    sampler, storage = make(backend, 600, 500, eps=0.0, max_priority_within_buffer=True)
    sampler.update_priority(torch.arange(0, 320, 10), torch.full((32,), 0.01))
    assert sampler.max_priority == 1.0  # 468 items still hold 1
    sampler.extend(torch.arange(500, 600))
    storage.set(range(500, 600), list(range(500, 600)))
    assert leaves(sampler)[500:].tolist() == [1.0] * 100
    counts = frequencies(sampler, storage, 8 * 4096)
    fresh = float(counts[500:].sum() / counts.sum())
    assert fresh == pytest.approx(100 / (468 + 32 * 0.01 + 100), abs=0.02)  # 0.176


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_max_priority_within_buffer_is_exact_for_any_alpha(backend, alpha):
    # raw priorities are kept: with alpha == 0 every slot stores 1, yet the max still falls to
    # the largest priority in the buffer (TorchRL keeps the previous max there)
    sampler, _ = make(backend, 5, 3, alpha=alpha, max_priority_within_buffer=True)
    sampler.update_priority(torch.tensor([0, 1]), torch.tensor([100.0, 10.0]))
    sampler.update_priority(torch.tensor([0]), torch.tensor([50.0]))
    assert sampler.max_priority == pytest.approx(50.0)
    sampler.alpha = 0.5 if alpha else 0.0  # annealing keeps the raw max
    assert sampler.max_priority == pytest.approx(50.0)
    sampler.update_priority(torch.tensor([0]), torch.tensor([2.0]))
    assert sampler.max_priority == pytest.approx(10.0)


# ---- update_priority input -------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64,
                                   torch.int64])
def test_any_real_dtype_is_accepted(backend, dtype):
    sampler, _ = make(backend, 4, 4, alpha=1.0, eps=0.0)
    sampler.update_priority(torch.tensor([0, 3]), torch.tensor([2, 3], dtype=dtype))
    assert leaves(sampler).tolist() == [2.0, 1.0, 1.0, 3.0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_python_and_numpy_inputs(backend):
    sampler, _ = make(backend, 4, 4, alpha=1.0, eps=0.0)
    sampler.update_priority(2, 5.0)
    sampler.update_priority([0, 1], np.array([3.0, 4.0], dtype=np.float32))
    sampler.update_priority(np.array([3]), [6])
    sampler.update_priority(torch.tensor([0, 1]), 0.5)  # a scalar for every index
    assert leaves(sampler).tolist() == [0.5, 0.5, 5.0, 6.0]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("reduction", "expected"),
    [("max", [3.0, 6.0]), ("min", [1.0, 4.0]), ("sum", [6.0, 15.0]), ("mean", [2.0, 5.0]),
     ("median", [2.0, 5.0])],
)
def test_reduction_of_trailing_dims(backend, reduction, expected):
    sampler, _ = make(backend, 4, 4, alpha=1.0, eps=0.0, reduction=reduction)
    sampler.update_priority(torch.tensor([1, 2]), torch.tensor([[1.0, 3.0, 2.0], [6.0, 4.0, 5.0]]))
    assert leaves(sampler)[1:3].tolist() == expected


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), -0.5])
def test_bad_priority_raises_and_changes_nothing(backend, bad):
    sampler, storage = make(backend, 6, 4)
    sampler.update_priority(torch.arange(4), torch.tensor([1.0, 2.0, 3.0, 4.0]))
    before = sampler.state_dict()
    with pytest.raises(ValueError, match="priority"):
        sampler.update_priority(torch.tensor([0, 1, 2]), torch.tensor([5.0, bad, 6.0]))
    with pytest.raises(ValueError, match="priority"):  # hidden in a reduced dim, too
        sampler.update_priority(torch.tensor([0]), torch.tensor([[9.0, bad]]))
    after = sampler.state_dict()
    for key, value in before.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, after[key]), key
        else:
            assert value == after[key], key


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_index_raises_and_changes_nothing(backend):
    sampler, storage = make(backend, 6, 4)
    before = leaves(sampler).clone()
    with pytest.raises(IndexError, match=r"\[0, 6\)"):
        sampler.update_priority(torch.tensor([0, 6]), torch.tensor([2.0, 2.0]))
    with pytest.raises(IndexError, match=r"\[0, 6\)"):
        sampler.update_priority(torch.tensor([-2]), torch.tensor([2.0]))
    with pytest.raises(IndexError, match="unwritten"):
        sampler.update_priority(torch.tensor([1, 5]), torch.tensor([2.0, 2.0]))
    storage._storage.pop()  # the storage holds 3 items now: slot 3 is no longer written
    with pytest.raises(IndexError, match="unwritten"):
        sampler.update_priority(torch.tensor([3]), torch.tensor([2.0]), storage=storage)
    with pytest.raises(TypeError, match="index"):
        sampler.update_priority(torch.tensor([0.0]), torch.tensor([2.0]))
    with pytest.raises(TypeError, match="priority"):
        sampler.update_priority(torch.tensor([0]), torch.tensor([True]))
    with pytest.raises(TypeError, match="priority"):
        sampler.update_priority(torch.tensor([0]), "high")
    with pytest.raises(ValueError, match="shape"):
        sampler.update_priority(torch.tensor([0, 1]), torch.tensor([1.0, 2.0, 3.0]))
    assert torch.equal(leaves(sampler), before)


@pytest.mark.parametrize("backend", BACKENDS)
def test_minus_one_marks_skipped_entries(backend):
    sampler, _ = make(backend, 4, 4, alpha=1.0, eps=0.0)
    sampler.update_priority(torch.tensor([-1, 2, -1]), torch.tensor([8.0, 3.0, 9.0]))
    assert leaves(sampler).tolist() == [1.0, 1.0, 3.0, 1.0]
    assert sampler.max_priority == 3.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_duplicate_indices_last_wins(backend):
    sampler, _ = make(backend, 4, 4, alpha=1.0, eps=0.0)
    sampler.update_priority(torch.tensor([1, 1, 1]), torch.tensor([5.0, 7.0, 2.0]))
    assert leaves(sampler)[1] == 2.0


# ---- stale updates ---------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_stale_updates_are_skipped(backend):
    sampler, storage = make(backend, 8, 8, alpha=1.0, eps=0.0)
    index, info = sampler.sample(storage, 64)
    gen = info["write_generation"]
    assert gen.shape == index.shape and bool((gen == 1).all())
    overwritten = torch.tensor([int(index[0])])
    sampler.update_priority(torch.arange(8), torch.full((8,), 2.0))  # max priority is now 2
    sampler.mark_update(overwritten)  # the row in that slot is replaced: generation 2
    assert sampler.slot_generation(overwritten).tolist() == [2]
    sampler.update_priority(index, torch.full(index.shape, 0.5), write_generation=gen)
    expected = torch.full((8,), 2.0, dtype=torch.float64)
    expected[torch.unique(index)] = 0.5
    expected[overwritten] = 2.0  # the new row keeps its own (max) priority
    assert torch.equal(leaves(sampler), expected)


@pytest.mark.parametrize("backend", BACKENDS)
def test_stale_check_can_be_turned_off(backend):
    sampler, storage = make(backend, 4, 4, alpha=1.0, eps=0.0, skip_stale_updates=False)
    index, info = sampler.sample(storage, 8)
    sampler.extend(index[:1])
    sampler.update_priority(index[:1], torch.tensor([0.25]), write_generation=info["write_generation"][:1])
    assert leaves(sampler)[index[0]] == 0.25


@pytest.mark.parametrize("backend", BACKENDS)
def test_generation_never_repeats_after_empty(backend):
    sampler, storage = make(backend, 4, 4, alpha=1.0, eps=0.0)
    index, info = sampler.sample(storage, 4)
    sampler.empty()
    assert leaves(sampler).sum() == 0
    sampler.extend(torch.arange(4))
    sampler.update_priority(index, torch.full((4,), 3.0), write_generation=info["write_generation"])
    assert leaves(sampler).tolist() == [1.0] * 4


@pytest.mark.parametrize("backend", BACKENDS)
def test_write_generation_shape_mismatch(backend):
    sampler, _ = make(backend, 4, 4)
    with pytest.raises(ValueError, match="write_generation"):
        sampler.update_priority(torch.tensor([0, 1]), torch.ones(2),
                                write_generation=torch.ones(3, dtype=torch.long))


# ---- sampling edge cases ---------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_sample_errors(backend):
    sampler = PrioritizedSampler(4, 0.5, 0.5, backend=backend)
    with pytest.raises(RuntimeError, match="empty"):
        sampler.sample(ListStorage(4), 2)
    sampler, storage = make(backend, 4, 2)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="batch_size"):
            sampler.sample(storage, bad)


@pytest.mark.parametrize("backend", BACKENDS)
def test_draws_beyond_the_written_slots_raise(backend):
    # the sampler was told of 8 slots, the storage holds 4: a draw of an unwritten slot is
    # refused by the sampler itself (buffers then read its draws without checking them again)
    sampler, storage = make(backend, 8, 4)
    sampler.extend(torch.arange(4, 8))
    assert sampler.draws_written_slots
    total = sampler.total_priority
    with pytest.raises(IndexError, match=r"drew slot [4-7], but the storage holds 4 written"):
        sampler.sample(storage, 64)
    assert sampler.total_priority == total  # nothing changed
    storage.set(torch.arange(4, 8), list(range(4, 8)))
    index, _ = sampler.sample(storage, 64)
    assert int(index.max()) >= 4 and int(index.min()) >= 0


def test_draws_written_slots_needs_the_sampler_own_sample():
    class Reordering(PrioritizedSampler):
        def sample(self, storage, batch_size):
            index, info = super().sample(storage, batch_size)
            return index.flip(0), info

    for sampler in (PrioritizedSampler(4, 1.0, 1.0), Reordering(4, 1.0, 1.0)):
        assert not sampler.draws_written_slots  # no trees yet
        sampler.extend(torch.arange(2))
    assert PrioritizedSampler(4, 1.0, 1.0).draws_written_slots is False
    assert sampler.draws_written_slots is False  # the subclass is not taken on trust


@pytest.mark.parametrize("backend", BACKENDS)
def test_storage_filled_before_the_sampler_saw_it(backend):
    storage = TensorStorage(torch.arange(6.0))  # a dataset: every slot written
    sampler = PrioritizedSampler(6, alpha=1.0, beta=1.0, backend=backend)
    sampler.set_rng(torch.Generator().manual_seed(0))
    index, info = sampler.sample(storage, 6000)
    counts = torch.bincount(index, minlength=6).double()
    assert chi_square(counts, torch.full((6,), 1 / 6, dtype=torch.float64)) < CHI2_CRIT_001[5]
    assert bool((info["priority_weight"] == 1).all())


@pytest.mark.parametrize("backend", BACKENDS)
def test_extend_beyond_max_capacity_grows_the_trees(backend):
    # a storage larger than max_capacity (TorchRL rounds its C++ trees up to a power of two)
    sampler = PrioritizedSampler(4, 1.0, 1.0, eps=0.0, backend=backend)
    sampler.place_for(ListStorage(21))  # settled on its (empty) storage: no row to seed
    sampler.extend(torch.tensor([2, 4]))
    assert sampler.max_capacity == 8  # at least doubled
    assert leaves(sampler).tolist() == [0, 0, 1, 0, 1, 0, 0, 0]
    sampler.update_priority(torch.tensor([4]), torch.tensor([3.0]))
    sampler.extend(torch.tensor([20]))
    assert sampler.max_capacity == 21
    assert leaves(sampler)[[2, 4, 20]].tolist() == [1.0, 3.0, 3.0]  # kept; new at the max
    with pytest.raises(IndexError, match="unwritten"):
        sampler.update_priority(torch.tensor([5]), torch.tensor([1.0]))
    with pytest.raises(IndexError, match=r"\[0, 21\)"):  # updates never grow
        sampler.update_priority(torch.tensor([21]), torch.tensor([1.0]))
    storage = storage_with(21, 21)
    index, _ = sampler.sample(storage, 2000)
    assert set(index.tolist()) == {2, 4, 20}  # only written slots are drawn
    counts = torch.bincount(index, minlength=21)[[2, 4, 20]].double() / 2000
    assert torch.allclose(counts, torch.tensor([1 / 7, 3 / 7, 3 / 7], dtype=torch.float64),
                          atol=0.05)


@pytest.mark.parametrize("backend", BACKENDS)
def test_grown_state_loads_into_a_sampler_of_the_original_size(backend):
    sampler = PrioritizedSampler(4, 1.0, 1.0, eps=0.0, backend=backend)
    sampler.extend(torch.arange(6))
    sampler.update_priority(torch.tensor([5]), torch.tensor([2.0]))
    restored = PrioritizedSampler(4, 1.0, 1.0, eps=0.0, backend=backend)
    restored.load_state_dict(sampler.state_dict())
    assert restored.max_capacity == 8
    assert torch.equal(leaves(restored), leaves(sampler))
    larger = PrioritizedSampler(10, 1.0, 1.0, eps=0.0, backend=backend)
    larger.load_state_dict(sampler.state_dict())  # a smaller state is padded: nothing lost
    assert larger.max_capacity == 10 and leaves(larger)[:8].tolist() == leaves(sampler).tolist()
    with pytest.raises(ValueError, match="max_capacity"):
        larger.load_state_dict({**sampler.state_dict(), "max_capacity": 0})


# ---- backends agree --------------------------------------------------------------------------
def test_backends_sample_identically():
    samplers = {}
    for backend in BACKENDS:
        sampler, storage = make(backend, 100, 90, alpha=0.7, beta=0.4)
        gen = torch.Generator().manual_seed(3)
        for _ in range(5):
            sampler.update_priority(torch.randint(0, 90, (40,), generator=gen),
                                    torch.rand(40, generator=gen) * 10)
            sampler.extend(torch.randint(0, 90, (5,), generator=gen))
        sampler.set_rng(torch.Generator().manual_seed(11))
        samplers[backend] = (sampler, [sampler.sample(storage, 257) for _ in range(3)])
    (s_numba, out_numba), (s_torch, out_torch) = samplers["numba"], samplers["torch"]
    for (i_a, info_a), (i_b, info_b) in zip(out_numba, out_torch):
        assert torch.equal(i_a, i_b)
        # libm and torch exp/log may differ in the last float64 bit
        torch.testing.assert_close(info_a["priority_weight"], info_b["priority_weight"],
                                   rtol=1e-6, atol=0)
        assert torch.equal(info_a["write_generation"], info_b["write_generation"])
    state_a, state_b = s_numba.state_dict(), s_torch.state_dict()
    for key in state_a:
        if isinstance(state_a[key], torch.Tensor):
            assert torch.equal(state_a[key], state_b[key]), key
        else:
            assert state_a[key] == state_b[key], key


# ---- state -----------------------------------------------------------------------------------
@pytest.mark.parametrize("source", BACKENDS)
@pytest.mark.parametrize("target", BACKENDS)
@pytest.mark.parametrize("within", [False, True])
def test_state_dict_round_trip_samples_the_same(source, target, within):
    sampler, storage = make(source, 50, 40, alpha=0.6, beta=0.3,
                            max_priority_within_buffer=within)
    gen = torch.Generator().manual_seed(1)
    sampler.update_priority(torch.arange(40), torch.rand(40, generator=gen) * 5)
    sampler.extend(torch.tensor([3, 4]))
    state = sampler.state_dict()
    restored = PrioritizedSampler(50, alpha=0.1, beta=0.9, backend=target,
                                  max_priority_within_buffer=within)
    restored.load_state_dict(state)
    assert (restored.alpha, restored.beta, restored.eps) == (0.6, 0.3, sampler.eps)
    assert restored.max_priority == sampler.max_priority
    sampler.set_rng(torch.Generator().manual_seed(5))
    restored.set_rng(torch.Generator().manual_seed(5))
    a, info_a = sampler.sample(storage, 300)
    b, info_b = restored.sample(storage, 300)
    assert torch.equal(a, b)
    torch.testing.assert_close(info_a["priority_weight"], info_b["priority_weight"],
                               rtol=1e-6, atol=0)
    assert torch.equal(info_a["write_generation"], info_b["write_generation"])
    # the write clock is restored: a new write gets a generation never used before
    sampler.extend(torch.tensor([0]))
    restored.extend(torch.tensor([0]))
    assert sampler.slot_generation(0) == restored.slot_generation(0) > int(state["write_clock"]) - 1


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("within", [False, True])
def test_extend_refuses_negative_slots_and_changes_nothing(backend, within):
    sampler, _ = make(backend, 8, 4, max_priority_within_buffer=within)
    before = sampler.state_dict()
    for slots in ([3, -2], [-1], [-5, 100]):
        with pytest.raises(IndexError, match="slots"):
            sampler.extend(torch.tensor(slots))
    after = sampler.state_dict()
    for key, value in before.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, after[key]), key
        else:
            assert value == after[key], key


@pytest.mark.parametrize("backend", BACKENDS)
def test_loaded_state_is_copied_not_shared(backend):
    sampler, _ = make(backend, 8, 4)
    state = sampler.state_dict()
    saved = {key: value.clone() if isinstance(value, torch.Tensor) else value
             for key, value in state.items()}
    restored = PrioritizedSampler(8, alpha=1.0, beta=1.0, backend=backend)
    restored.load_state_dict(state)
    restored.extend(torch.tensor([0, 5]))  # new write generations and priorities
    restored.update_priority(torch.tensor([1]), torch.tensor([9.0]))
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, saved[key]), key
    assert restored.slot_generation(5) > 0 and int(state["write_generation"][5]) == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_state_dict_is_refused_and_changes_nothing(backend):
    sampler, _ = make(backend, 8, 4)
    good = sampler.state_dict()
    before = leaves(sampler).clone()
    bad_states = [
        {k: v for k, v in good.items() if k != "alpha"},
        {**good, "max_capacity": 9},
        {**good, "priorities": good["priorities"][:4]},
        {**good, "priorities": good["priorities"].float()},
        {**good, "priorities": torch.where(good["priorities"] > 0, float("nan"), 0.0)},
        {**good, "write_generation": torch.zeros(8, dtype=torch.long)},  # disagrees with priorities
        {**good, "write_clock": 0},
        {**good, "alpha": -1.0},
        {**good, "set_priorities": torch.zeros(8, dtype=torch.float64)},
    ]
    for state in bad_states:
        with pytest.raises(ValueError):
            sampler.load_state_dict(state)
    assert torch.equal(leaves(sampler), before)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("value", [math.inf, math.nan, -2.0])
def test_a_damaged_set_priority_is_refused(backend, value):
    # (an inf among the raw priorities of max_priority_within_buffer was loaded: max_priority
    # inf, new rows written at 2.2e307 and drawn alone, with weights 0)
    sampler, _ = make(backend, 8, 8, max_priority_within_buffer=True)
    sampler.update_priority(torch.arange(8), torch.arange(8.0) + 1)
    state = sampler.state_dict()
    state["set_priorities"][2] = value
    other, _ = make(backend, 8, 8, max_priority_within_buffer=True)
    before = other.state_dict()
    with pytest.raises(ValueError, match=r"set_priorities'\] holds NaN, infinite or negative"):
        other.load_state_dict(state)
    assert torch.equal(leaves(other), before["priorities"]) and other.max_priority == 1.0
    state["set_priorities"][2] = -math.inf  # (a slot no update set: loads)
    other.load_state_dict(state)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_priority_set_inside_an_exclusion_is_kept(backend):
    # (the block put the saved leaf back over the update: slot 0 ended at its old priority)
    sampler, storage = make(backend, 8, 8, eps=0.0)
    with sampler.excluded(torch.tensor([0, 1])):
        index, _ = sampler.sample(storage, 256)
        assert int(index.min()) >= 2
        sampler.update_priority(torch.tensor([0, 2]), torch.tensor([50.0, 60.0]))
    assert leaves(sampler).tolist() == [50.0, 1.0, 60.0] + [1.0] * 5
    assert float(sampler.total_priority) == pytest.approx(50 + 1 + 60 + 5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_alpha_that_overflows_the_trees_says_so(backend):
    # (alpha 1 -> 2 lowered a priority of 1e200 to 2.2e307 without a word; an update of the
    # same value at alpha 2 is refused)
    sampler, _ = make(backend, 8, 4)
    sampler.update_priority(torch.tensor([0]), torch.tensor([1e200], dtype=torch.float64))
    with pytest.warns(UserWarning, match=r"alpha=2.0 raises priorities \[1e\+200\].*stored "
                                         r"at that limit"):
        sampler.alpha = 2.0
    assert float(leaves(sampler)[0]) == pytest.approx(float(np.finfo(np.float64).max) / 8)
    assert math.isfinite(float(sampler.total_priority))


@pytest.mark.parametrize("backend", BACKENDS)
def test_trees_that_grow_keep_a_finite_total(backend):
    # (priorities at the limit of 8 slots summed to inf once the trees grew to 16: every draw
    # then fell on slot 8)
    sampler = PrioritizedSampler(8, alpha=1.0, beta=0.5, eps=0.0, backend=backend)
    storage = storage_with(16, 16)
    sampler.extend(torch.arange(8))
    sampler.update_priority(torch.arange(8), torch.full((8,), 2.2e307, dtype=torch.float64))
    with pytest.warns(UserWarning, match="grew to 16 slots.*lowered"):
        sampler.extend(torch.arange(8, 16))
    assert sampler.max_capacity == 16 and math.isfinite(float(sampler.total_priority))
    sampler.set_rng(torch.Generator().manual_seed(0))
    index, _ = sampler.sample(storage, 4000)
    # (the new slots took the max priority, lowered alike: every slot is as likely)
    assert 1700 < int((index < 8).sum()) < 2300 and index.unique().numel() == 16


def test_state_of_an_unused_sampler():
    sampler = PrioritizedSampler(5, 0.5, 0.5)
    state = sampler.state_dict()
    assert state["priorities"].tolist() == [0.0] * 5
    assert state["write_clock"] == 0 and state["max_priority"] == -math.inf
    other = PrioritizedSampler(5, 0.5, 0.5, backend="torch")
    other.load_state_dict(state)
    assert other.max_priority == 1.0


# ---- invariants ------------------------------------------------------------------------------
@settings(max_examples=30, deadline=None)
@given(
    backend=st.sampled_from(BACKENDS),
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("extend"), st.integers(1, 6)),
            st.tuples(st.just("update"), st.lists(st.floats(0, 100), min_size=1, max_size=6)),
            st.tuples(st.just("sample"), st.integers(1, 20)),
        ),
        min_size=1,
        max_size=25,
    ),
)
def test_random_operations_keep_the_trees_consistent(backend, ops):
    capacity = 10
    sampler = PrioritizedSampler(capacity, alpha=0.5, beta=0.5, eps=1e-3, backend=backend)
    sampler.set_rng(torch.Generator().manual_seed(0))
    storage = ListStorage(capacity)
    cursor = 0
    expected = torch.zeros(capacity, dtype=torch.float64)
    max_raw = -math.inf
    last = None
    for op, arg in ops:
        if op == "extend":
            slots = torch.arange(cursor, cursor + arg) % capacity
            cursor += arg
            written = min(cursor, capacity)
            storage._storage = list(range(written))
            sampler.extend(slots)
            raw = 1.0 if max_raw == -math.inf else max_raw
            expected[slots] = max((raw + 1e-3) ** 0.5, 0.0)
        elif op == "update" and len(storage):
            slots = torch.arange(len(arg)) % len(storage)
            values = torch.tensor(arg, dtype=torch.float64)
            if last is not None and len(last[0]) >= len(arg):
                # priorities of the last sample: stale slots must be skipped
                index, gen = last[0][: len(arg)], last[1][: len(arg)]
                fresh = sampler.slot_generation(index) == gen
                sampler.update_priority(index, values, write_generation=gen)
                for i, v, f in zip(index.tolist(), values.tolist(), fresh.tolist()):
                    if f:
                        expected[i] = (v + 1e-3) ** 0.5
                        max_raw = max(max_raw, v)
            else:
                sampler.update_priority(slots, values, storage=storage)
                for i, v in zip(slots.tolist(), values.tolist()):
                    expected[i] = (v + 1e-3) ** 0.5
                    max_raw = max(max_raw, v)
        elif op == "sample" and len(storage):
            index, info = sampler.sample(storage, arg)
            assert bool((index < len(storage)).all())
            assert bool((expected[index] > 0).all())
            last = (index, info["write_generation"])
    state = sampler.state_dict()
    torch.testing.assert_close(state["priorities"], expected, rtol=1e-12, atol=0)
