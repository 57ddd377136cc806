"""Differential / model-based tests of the prioritized sampler (and of the other weighted
sampler, ``StalenessAwareSampler``).

Seeded random histories of extends (with and without priorities in the data, writes larger
than the buffer, a storage larger than ``max_capacity`` so the trees grow), index assignments,
``update_priority`` / ``update_tensordict_priority`` (with the sample's write generations after
the slots were overwritten, duplicates, zeros, multi-dimensional priorities reduced by every
``reduction``), changes of ``alpha`` and ``beta``, ``empty()`` and restores (``state_dict``
into a fresh or a used buffer, ``dumps`` / ``loads``, pickle, deepcopy) are applied to a
buffer with numba trees, a twin with torch trees and the restored copies, in lockstep. After
every step they are compared with a Python model of the documented behaviour:

* stored priority ``p_i = max((q_i + eps) ** alpha, tiny)``; new items get the max priority
  (the largest ever set by an update, or with ``max_priority_within_buffer`` the largest
  among the items still stored, those the write overwrites left out; ``1`` before any); an
  update whose generation is
  stale is dropped; the last duplicate wins;
* ``total_priority`` and ``min_priority`` equal the model's sum and min, ``max_priority`` its
  max, the write generations order the writes as the model's clock does;
* ``priority_weight`` of a sampled slot is ``(p_i / p_min) ** -beta``; the draws follow
  ``p_i / sum p`` (a frequency check on 20,000 draws);
* the torch-tree twin and every restored buffer draw the same slots and weights.

Schedulers are compared with values TorchRL 0.14.1's schedulers gave for the same settings.
The first tests are focused reproductions of divergences (``xfail(strict=True)`` until fixed);
the others guard the behaviours that agree.
"""

from __future__ import annotations

import math
import random
import tempfile
import warnings

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ReplayBuffer, TensorDictReplayBuffer
from tdreplay.core.testing import restored
from tdreplay.samplers import (
    LinearScheduler,
    PrioritizedSampler,
    StalenessAwareSampler,
    StepScheduler,
)
from tdreplay.storages import LazyTensorStorage

TINY = float(np.finfo(np.float64).tiny)


# ---- focused reproductions ----------------------------------------------------------------------

def test_alpha_change_keeps_a_zero_priority_at_the_clamp():
    # sampling guide: changing alpha rewrites the stored (priority + eps) ** alpha of every
    # written slot with the new exponent; module docstring: p = max((q + eps) ** alpha, tiny).
    # For q = 0, eps = 0 that is tiny for every alpha, but the setter inverted the stored tiny
    # as if it were (q + eps) ** old: min_priority, hence every importance weight's
    # normaliser, jumped by ~150 orders of magnitude.
    s = PrioritizedSampler(4, alpha=1.0, beta=1.0, eps=0.0)
    s.extend(torch.arange(2))
    s.update_priority(torch.arange(2), torch.tensor([0.0, 4.0]))
    assert s.min_priority == TINY
    s.alpha = 0.5
    assert s.total_priority == pytest.approx(2.0)
    assert s.min_priority == TINY  # got 1.49e-154


def test_staleness_sampler_never_draws_zero_weight_items():
    # StalenessAwareSampler: items are drawn "in proportion to staleness_weight_fn", which may
    # return 0 ("non-negative weights ... not all zero"). torch.multinomial without
    # replacement filled the batch with zero-weight items once the positive ones were drawn
    # (TorchRL 0.14.1 does the same). Expected: with replacement among the positive weights,
    # as when fewer items qualify than the batch holds.
    sampler = StalenessAwareSampler(staleness_weight_fn=lambda s: (s == 0).float())
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), sampler=sampler, batch_size=8)
    for version in range(4):
        rb.extend(TensorDict({"policy_version": torch.full((5,), version)}, [5]))
    sampler.consumer_version = 3
    assert rb.sample()["policy_version"].tolist() == [3] * 8  # got [3, 3, 3, 3, 3, 2, 2, 2]


# ---- the model ------------------------------------------------------------------------------

class _Model:
    def __init__(self, cfg: dict) -> None:
        self.n, self.alpha, self.beta, self.eps = cfg["n"], cfg["alpha"], cfg["beta"], cfg["eps"]
        self.within = cfg["within"]
        self.q: dict[int, float] = {}  # slot -> raw priority
        self.gen: dict[int, int] = {}
        self.clock = 0
        self.max_ever: float | None = None
        self.cursor = self.len = 0

    def default(self, leaving: frozenset[int] = frozenset()) -> float:
        if self.within:  # every item still stored counts, those the write overwrites leave
            values = [self.q[s] for s in self.q if s not in leaving]
            return max(values) if values else 1.0
        return self.max_ever if self.max_ever is not None else 1.0

    def written(self, slots: list[int]) -> None:
        default = self.default(frozenset(slots))
        self.clock += 1
        for s in slots:
            self.q[s], self.gen[s] = default, self.clock

    def rewritten(self, slots: list[int]) -> None:
        """Index assignment: the slots keep their priority and get a new write generation."""
        self.clock += 1
        for s in slots:
            self.gen[s] = self.clock

    def write(self, k: int) -> list[int]:
        slots = []
        for _ in range(k):
            slots.append(self.cursor)
            self.cursor = (self.cursor + 1) % self.n
            self.len = min(self.len + 1, self.n)
        self.written(slots)
        return slots

    def update(self, index: list[int], values: list[float], gens: list[int] | None = None
               ) -> None:
        for j, (s, p) in enumerate(zip(index, values)):
            if gens is not None and self.gen[s] != gens[j]:
                continue  # stale: the slot was written since it was sampled
            self.q[s] = p
            self.max_ever = p if self.max_ever is None else max(self.max_ever, p)

    def reset(self) -> None:
        self.q.clear()
        self.gen.clear()
        self.cursor = self.len = 0
        self.max_ever = None

    def leaf(self, s: int) -> float:
        return max((self.q[s] + self.eps) ** self.alpha, TINY)

    def total(self) -> float:
        return sum(self.leaf(s) for s in self.q)

    def p_min(self) -> float:
        return min(self.leaf(s) for s in self.q)


def _make(cfg: dict, seed: int, backend: str) -> TensorDictReplayBuffer:
    sampler = PrioritizedSampler(cfg["max_capacity"], cfg["alpha"], cfg["beta"], eps=cfg["eps"],
                                 reduction=cfg["reduction"],
                                 max_priority_within_buffer=cfg["within"], backend=backend,
                                 stratified=cfg["stratified"])
    return TensorDictReplayBuffer(storage=LazyTensorStorage(cfg["n"]), sampler=sampler,
                                  batch_size=cfg["batch"],
                                  generator=torch.Generator().manual_seed(seed))


def _row(cfg: dict, x: torch.Tensor) -> TensorDict:
    td = TensorDict({"x": x}, x.shape)
    if cfg["extend_prio"]:
        td["td_error"] = torch.full(x.shape, 0.5)
    return td


def _restore(rb: TensorDictReplayBuffer, how: str, cfg: dict, used: bool
             ) -> TensorDictReplayBuffer:
    def make():
        new = _make(cfg, 999, "numba")
        if used:
            new.extend(_row(cfg, torch.zeros(2)))
            new.sample(2)
        return new

    return restored(rb, make, how)


def _check_model(rb: TensorDictReplayBuffer, m: _Model) -> None:
    s = rb.sampler
    assert math.isclose(s.total_priority, m.total(), rel_tol=1e-9)
    assert math.isclose(s.min_priority, m.p_min(), rel_tol=1e-9)
    assert math.isclose(s.max_priority, m.default(), rel_tol=1e-9)
    gens = s.slot_generation(torch.arange(m.len)).tolist()
    pairs = sorted({(m.gen[i], gens[i]) for i in range(m.len)})
    # one sampler generation per model write, in the same order
    assert len({a for a, _ in pairs}) == len(pairs) == len({b for _, b in pairs})
    assert [b for _, b in pairs] == sorted(b for _, b in pairs)


def _run_history(cfg: dict, seed: int) -> int:
    pyrng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed + 7)
    m = _Model(cfg)
    rbs, names = [_make(cfg, seed, "numba")], ["numba"]
    if cfg["torch_twin"]:
        rbs.append(_make(cfg, seed, "torch"))
        names.append("torch")
    samples: list[tuple[list[int], list[int], list[int]]] = []
    xval = 0
    checked = 0
    for _ in range(cfg["steps"]):
        op = pyrng.random()
        if op < 0.3 or m.len == 0:
            k = pyrng.choice(cfg["write_sizes"])
            td = TensorDict({"x": torch.arange(xval, xval + k, dtype=torch.float32)}, [k])
            xval += k
            slots = m.write(k)
            if cfg["extend_prio"]:  # priorities come with the data
                td["td_error"] = (torch.rand(k, generator=gen, dtype=torch.float64) * 4).float()
                m.update(slots, td["td_error"].double().tolist())
            for rb in rbs:
                assert rb.extend(td.clone()).tolist() == slots
        elif op < 0.36 and len(rbs) < 4:
            how = pyrng.choice(["pickle", "deepcopy", "state_dict", "dumps"])
            rbs.append(_restore(rbs[0], how, cfg, used=pyrng.random() < 0.5))
            names.append(how)
            # a batch carries the generation tokens of the buffer it was drawn from; one
            # restored into a used buffer numbers its generations after those it gave out
            samples = []
        elif op < 0.40 and cfg["assign"]:
            slot = pyrng.randrange(m.len)
            m.rewritten([slot])  # rb[i] = x: the priority kept (as TorchRL), a new generation
            for rb in rbs:
                rb[slot] = _row(cfg, torch.tensor(-1.0))
        elif op < 0.44 and cfg["change_alpha"]:
            m.alpha = pyrng.choice([0.3, 0.7, 1.0, 1.5])
            for rb in rbs:
                rb.sampler.alpha = m.alpha
        elif op < 0.46 and cfg["empty"]:
            for rb in rbs:
                rb.empty()
            m.reset()
            samples = []
        elif op < 0.47 and m.len:
            n = 20_000
            outs = [rb.sample(n) for rb in rbs]
            counts = torch.bincount(outs[0]["index"], minlength=m.len).tolist()
            total = m.total()
            for slot in range(m.len):
                p = m.leaf(slot) / total
                assert abs(counts[slot] - n * p) <= 5 * math.sqrt(n * p * (1 - p)) + 3
            assert all(torch.equal(o["index"], outs[0]["index"]) for o in outs[1:])
        elif op < 0.50:
            m.beta = pyrng.choice([0.0, 0.4, 1.0])
            for rb in rbs:
                rb.sampler.beta = m.beta
        elif op < 0.75:
            batch_size = pyrng.choice([1, 3, cfg["batch"]])
            outs = [rb.sample(batch_size) for rb in rbs]
            first = outs[0]
            idx = first["index"].tolist()
            assert all(0 <= i < m.len for i in idx), "an unwritten slot was drawn"
            p_min = m.p_min()
            expected = [(m.leaf(i) / p_min) ** -m.beta for i in idx]
            assert first["priority_weight"].tolist() == pytest.approx(expected, rel=1e-5)
            samples.append((idx, [o["write_generation"].tolist() for o in outs],
                            [m.gen[i] for i in idx]))
            for name, other in zip(names[1:], outs[1:]):
                assert other["index"].tolist() == idx, name
                assert torch.allclose(other["priority_weight"], first["priority_weight"],
                                      rtol=1e-6), name
            checked += 1
        elif samples:
            idx, gens, model_gens = pyrng.choice(samples[-3:])
            kind = pyrng.choice(["td", "plain", "multi", "zeros", "duplicate"])
            n = len(idx)
            if kind == "multi":
                priority = torch.rand(n, 3, generator=gen, dtype=torch.float64) * 5
                values = {"max": priority.amax(1), "min": priority.amin(1),
                          "sum": priority.sum(1), "mean": priority.mean(1),
                          "median": priority.median(1).values}[cfg["reduction"]].tolist()
            elif kind == "zeros":
                priority = torch.zeros(n, dtype=torch.float64)
                values = priority.tolist()
            else:
                priority = torch.rand(n, generator=gen, dtype=torch.float64) * 5
                values = priority.tolist()
            if kind == "td":  # with the sample's generations: stale entries are skipped
                priority = priority.float()
                m.update(idx, priority.double().tolist(), model_gens)
                for rb, tokens in zip(rbs, gens, strict=True):
                    rb.update_tensordict_priority(TensorDict({
                        "index": torch.tensor(idx), "write_generation": torch.tensor(tokens),
                        "td_error": priority.clone()}, [n]))
            else:  # no generations: applied as given, the last duplicate wins
                index = list(idx)
                if kind == "duplicate":
                    index.append(idx[0])
                    priority = torch.cat([priority, torch.tensor([2.5], dtype=priority.dtype)])
                    values = values + [2.5]
                m.update(index, values)
                for rb in rbs:
                    rb.update_priority(torch.tensor(index), priority.clone())
        if m.len:
            for rb in rbs:
                _check_model(rb, m)
    return checked


def _config(seed: int) -> dict:
    r = random.Random(seed)
    n = r.randint(2, 40)
    return dict(n=n, max_capacity=r.choice([n, n, max(1, n // 2)]),
                alpha=r.choice([0.5, 0.7, 1.0]), beta=r.choice([0.0, 0.4, 1.0]),
                eps=r.choice([0.0, 1e-8, 0.1]), within=r.random() < 0.3,
                reduction=r.choice(["max", "min", "sum", "mean", "median"]),
                stratified=r.random() < 0.3, batch=r.randint(1, 16),
                write_sizes=r.choice([[1, 2, 3], [1, n // 2 + 1, n + 3]]),
                extend_prio=r.random() < 0.5, assign=r.random() < 0.4,
                change_alpha=r.random() < 0.4, torch_twin=r.random() < 0.5,
                empty=r.random() < 0.3, steps=r.randint(30, 60))


# ---- guard: histories on which the sampler and the model agree -----------------------------------

@pytest.mark.parametrize("seed", range(16))
def test_history_matches_model_twins_and_restores(seed):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (a storage larger than max_capacity: the trees grow)
        assert _run_history(_config(seed), seed) > 0


@pytest.mark.parametrize("within", [False, True])
def test_history_with_every_option_at_once(within):
    cfg = _config(3)
    cfg.update(n=12, max_capacity=5, within=within, extend_prio=False, assign=True,
               change_alpha=True, torch_twin=True, empty=True, steps=120, eps=0.1,
               write_sizes=[1, 4, 15], stratified=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert _run_history(cfg, 3) > 10


def test_threaded_update_and_draws_match_one_thread_and_the_model(torch_threads):
    # updates and draws of >= 16,384 slots are split over threads: same trees, same draws
    def run(threads: int, backend: str = "numba"):
        torch.set_num_threads(threads)
        n = 50_000
        rb = ReplayBuffer(storage=LazyTensorStorage(n),
                          sampler=PrioritizedSampler(n, 0.7, 0.5, backend=backend),
                          generator=torch.Generator().manual_seed(0))
        rb.extend(torch.arange(30_000))
        g = torch.Generator().manual_seed(1)
        idx = torch.randint(0, 30_000, (40_000,), generator=g)  # many duplicates
        priority = torch.rand(40_000, generator=g, dtype=torch.float64) * 10
        rb.update_priority(idx, priority)
        _, info = rb.sample(30_000, return_info=True)
        rb.extend(torch.arange(25_000))  # slots 30,000..49,999 and 0..4,999: written since
        later = torch.rand(30_000, generator=g, dtype=torch.float64)
        rb.sampler.update_priority(info["index"], later, storage=rb.storage,
                                   write_generation=info["write_generation"])
        _, info2 = rb.sample(20_000, return_info=True)
        leaves = rb.sampler.state_dict()["priorities"].double()[:n]
        return leaves, info2["index"], info2["priority_weight"], (idx, priority, info, later)

    one, two, torch_tree = run(1), run(2), run(2, "torch")
    for a, b in ((one, two), (one, torch_tree)):
        assert all(torch.equal(x, y) for x, y in zip(a[:3], b[:3]))
    idx, priority, info, later = one[3]
    q = dict.fromkeys(range(30_000), 1.0)
    for i, p in zip(idx.tolist(), priority.tolist()):
        q[i] = p
    fresh = set(range(30_000, 50_000)) | set(range(5_000))
    q.update(dict.fromkeys(fresh, float(priority.max())))
    for i, p in zip(info["index"].tolist(), later.tolist()):
        if i not in fresh:
            q[i] = p
    expected = torch.tensor([max((q[i] + 1e-8) ** 0.7, TINY) for i in range(50_000)],
                            dtype=torch.float64)
    assert torch.allclose(one[0], expected, rtol=1e-12, atol=0)


# (alpha, beta, scheduler) -> (alpha, beta) after each of 8 steps, as TorchRL 0.14.1's
# schedulers give them for a sampler with these alpha and beta
_TORCHRL_SCHEDULES = {
    (0.7, 0.4, "linear_beta"): [0.52, 0.64, 0.76, 0.88, 1.0, 1.0, 1.0, 1.0],
    (0.7, 0.4, "linear_alpha"): [0.5, 0.3, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1],
    (0.7, 0.4, "step_alpha"): [0.7, 0.35, 0.35, 0.2, 0.2, 0.2, 0.2, 0.2],
    (0.7, 0.4, "additive_beta"): [0.65, 0.9, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
    (0.7, 0.4, "additive_beta_3"): [0.4, 0.4, 0.7, 0.7, 0.7, 1.0, 1.0, 1.0],
    (0.7, 0.4, "step_alpha_up"): [1.4, 2.8, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0],
    (1.0, 0.0, "linear_beta"): [0.2, 0.4, 0.6, 0.8, 1.0, 1.0, 1.0, 1.0],
    (1.0, 0.0, "step_alpha"): [1.0, 0.5, 0.5, 0.25, 0.25, 0.2, 0.2, 0.2],
}


def _scheduler(obj, name: str):
    return {
        "linear_beta": lambda: LinearScheduler(obj, "beta", final_value=1.0, num_steps=5),
        "linear_alpha": lambda: LinearScheduler(obj, "alpha", final_value=0.1, num_steps=3),
        "step_alpha": lambda: StepScheduler(obj, "alpha", gamma=0.5, n_steps=2, min_value=0.2),
        "additive_beta": lambda: StepScheduler(obj, "beta", gamma=0.25, n_steps=1,
                                               mode="additive", max_value=1.0),
        "additive_beta_3": lambda: StepScheduler(obj, "beta", gamma=0.3, n_steps=3,
                                                 mode="additive"),
        "step_alpha_up": lambda: StepScheduler(obj, "alpha", gamma=2.0, n_steps=1,
                                               max_value=3.0),
    }[name]()


@pytest.mark.parametrize("key", sorted(_TORCHRL_SCHEDULES))
def test_schedulers_match_torchrl_and_the_trees_follow_alpha(key):
    alpha, beta, name = key
    param = "alpha" if "alpha" in name else "beta"

    def make():
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(16), batch_size=4,
                                    sampler=PrioritizedSampler(16, alpha, beta),
                                    generator=torch.Generator().manual_seed(0))
        return rb, _scheduler(rb, name)

    rb, scheduler = make()
    rb.extend(TensorDict({"x": torch.arange(6.0)}, [6]))
    q = [0.5, 2.0, 3.0, 0.0, 1.0, 7.0]
    rb.update_priority(torch.arange(6), torch.tensor(q))
    got = []
    for step in range(8):
        if step == 4:  # a run resumed from a checkpoint goes on where it stopped
            with tempfile.TemporaryDirectory() as path:
                rb.dumps(path)
                rb, scheduler = make()
                rb.loads(path)
        scheduler.step()
        got.append(round(float(getattr(rb.sampler, param)), 6))
        a = float(rb.sampler.alpha)
        leaves = [max((p + 1e-8) ** a, TINY) for p in q]
        assert rb.sampler.total_priority == pytest.approx(sum(leaves), rel=1e-9)
        assert rb.sampler.min_priority == pytest.approx(min(leaves), rel=1e-9)
        sample = rb.sample()
        b = float(rb.sampler.beta)
        expected = [(leaves[i] / min(leaves)) ** -b for i in sample["index"].tolist()]
        assert sample["priority_weight"].tolist() == pytest.approx(expected, rel=1e-5)
    assert got == _TORCHRL_SCHEDULES[key]


def test_staleness_sampler_draws_only_fresh_enough_items_in_proportion():
    # max_staleness leaves items out; the rest are drawn in proportion to 1 / (staleness + 1)
    sampler = StalenessAwareSampler(max_staleness=2)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(40), sampler=sampler, batch_size=10,
                                generator=torch.Generator().manual_seed(0))
    for version in range(5):
        rb.extend(TensorDict({"policy_version": torch.full((4,), version)}, [4]))
    sampler.consumer_version = 4
    counts = torch.zeros(5)
    for _ in range(2000):
        batch = rb.sample(1)
        assert torch.equal(batch["staleness"], 4.0 - batch["policy_version"].float())
        counts[batch["policy_version"]] += 1
    assert counts[:2].sum() == 0
    weights = torch.tensor([1 / 3, 1 / 2, 1.0])
    assert torch.allclose(counts[2:] / 2000, weights / weights.sum(), atol=0.04)
    # without replacement while enough items qualify
    assert len(set(rb.sample(12)["index"].tolist())) == 12
