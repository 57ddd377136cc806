"""Model-based fuzzing of ``PromptGroupSampler``, ``StalenessAwareSampler`` and the priority
schedulers (``LinearScheduler``, ``StepScheduler``, ``SchedulerList``, tensor alpha/beta).

Seeded random histories of extend / add / sample / update_priority / scheduler steps / empty /
restores (``tdreplay.core.testing.restored``) are checked against a small pure-Python model of
the documented behaviour: which items a batch may hold, group layout, which slots are drawable
given staleness weights and ``max_staleness``, the parameter after ``k`` scheduler steps, and
that a restored copy goes on exactly as the original (same draws, same scheduler values).
Refused calls must name the argument and leave the buffer as it was.
"""

from __future__ import annotations

import copy
import itertools
import math
import pickle
import random
import warnings
from typing import Any

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ReplayBuffer, TensorDictReplayBuffer
from tdreplay.core.testing import RESTORES, assert_same, buffer_snapshot, restored
from tdreplay.samplers import (
    LinearScheduler,
    PromptGroupSampler,
    SchedulerList,
    StalenessAwareSampler,
    StepScheduler,
    TensorDictPrioritizedReplayBuffer,
)
from tdreplay.storages import LazyMemmapStorage, LazyStackStorage, LazyTensorStorage

SEEDS = range(12)
CAPACITY = 12


def _same_draw(a: ReplayBuffer, b: ReplayBuffer, batch_size: int) -> None:
    """``a`` and ``b`` draw the same next batch (data and info)."""
    da, ia = a.sample(batch_size, return_info=True)
    db, ib = b.sample(batch_size, return_info=True)
    assert_same(da, db, "sample")
    assert_same(ia, ib, "info")


def _refused(rb: ReplayBuffer, exc: type[BaseException], match: str, call: Any,
             *args: Any, **kwargs: Any) -> None:
    """``call(*args, **kwargs)`` raises ``exc`` naming ``match`` and leaves ``rb`` (and its generator) as it
    was."""
    before = buffer_snapshot(rb)
    generator = rb.sampler.generator
    rng = generator.get_state() if generator is not None else None
    with pytest.raises(exc, match=match):
        call(*args, **kwargs)
    assert_same(buffer_snapshot(rb), before, "after refusal")
    if rng is not None:
        assert torch.equal(rb.sampler.generator.get_state(), rng)


# ============================================================================================
# PromptGroupSampler
# ============================================================================================
STRATEGIES = ("random", "recency", "reward", "variance")


class GroupModel:
    """Ring storage of items ``(group, reward, uid, clock)``; the sampler's documented choice."""

    def __init__(self) -> None:
        self.slots: dict[int, tuple[int, float, int, int]] = {}
        self.cursor = 0
        self.clock = 0

    def write(self, items: list[tuple[int, float, int]]) -> None:
        for group, reward, uid in items:
            self.clock += 1
            self.slots[self.cursor] = (group, reward, uid, self.clock)
            self.cursor = (self.cursor + 1) % CAPACITY

    def edit(self, slot: int, item: tuple[int, float, int]) -> None:
        self.clock += 1
        self.slots[slot] = (*item, self.clock)

    def empty(self) -> None:
        self.__init__()

    def groups(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for slot in sorted(self.slots):
            out.setdefault(self.slots[slot][0], []).append(slot)
        return out


def _best_variance(rewards: list[float], k: int) -> tuple[float, float]:
    """(variance, total) of RePO's choice: the max-variance subset, ties by max total."""
    best: tuple[float, float] | None = None
    for combo in itertools.combinations(rewards, k):
        mean = sum(combo) / k
        var = sum((r - mean) ** 2 for r in combo) / k
        if best is None or var > best[0] + 1e-9 or (abs(var - best[0]) <= 1e-9
                                                        and sum(combo) > best[1]):
            best = (var, sum(combo))
    assert best is not None
    return best


def _check_group_batch(model: GroupModel, sampler: PromptGroupSampler, data: TensorDict,
                       info: dict[str, Any], batch_size: int) -> None:
    assert set(info) == {"index"}
    index = info["index"]
    assert index.dtype == torch.long and index.shape == (batch_size,)
    assert data.batch_size == (batch_size,)
    assert data["g"].dtype == torch.long and data["r"].dtype == torch.float32
    assert data["uid"].dtype == torch.long
    num_groups, per = sampler.batch_shape(batch_size)
    groups = model.groups()
    for slot, g, r, uid in zip(index.tolist(), data["g"].tolist(), data["r"].tolist(),
                               data["uid"].tolist(), strict=True):
        assert slot in model.slots, f"slot {slot} holds nothing"
        mg, mr, muid, _ = model.slots[slot]
        assert (g, uid) == (mg, muid) and r == pytest.approx(mr)
    rows = index.reshape(num_groups, per).tolist()
    chosen = [model.slots[row[0]][0] for row in rows]
    if len(groups) >= num_groups:
        assert len(set(chosen)) == num_groups, "groups are drawn without replacement"
    else:
        assert set(chosen) == set(groups), "every group is drawn before any repeats"
    for row, group in zip(rows, chosen, strict=True):
        members = groups[group]
        assert all(model.slots[s][0] == group for s in row), "a row mixes groups"
        if len(members) < per:
            assert set(row[:len(members)]) == set(members)
            continue
        assert len(set(row)) == per, "items of a large enough group are distinct"
        if sampler.strategy == "recency":
            newest = sorted(members, key=lambda s: model.slots[s][3])[-per:]
            assert set(row) == set(newest)
        elif sampler.strategy == "reward":
            best = sorted(members, key=lambda s: model.slots[s][1])[-per:]
            assert set(row) == set(best)
        elif sampler.strategy == "variance":
            rewards = [model.slots[s][1] for s in row]
            mean = sum(rewards) / per
            var = sum((x - mean) ** 2 for x in rewards) / per
            best_var, best_total = _best_variance([model.slots[s][1] for s in members], per)
            assert var == pytest.approx(best_var, rel=1e-5, abs=1e-5)
            assert sum(rewards) == pytest.approx(best_total, rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("seed", SEEDS)
def test_prompt_group_history(seed: int) -> None:
    rnd = random.Random(seed)
    strategy = STRATEGIES[seed % 4]
    by_groups = rnd.random() < 0.5
    storage_cls = LazyTensorStorage if seed % 2 else LazyStackStorage
    num = rnd.choice([1, 2, 3])

    def make() -> ReplayBuffer:
        kwargs = {"num_groups": num} if by_groups else {"samples_per_group": num}
        sampler = PromptGroupSampler(group_key="g", strategy=strategy, reward_key="r",
                                     cache_groups=rnd.random() < 0.8, **kwargs)
        return ReplayBuffer(storage=storage_cls(CAPACITY), sampler=sampler,
                            generator=torch.Generator().manual_seed(seed))

    rb, model, uid = make(), GroupModel(), 0
    keep: list[Any] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(40):
            op = rnd.choices(["extend", "add", "edit", "sample", "bad", "empty", "restore"],
                             [5, 3, 1.5, 6, 1, 0.4, 1])[0]
            if op in ("extend", "add"):
                n = rnd.randint(1, 5) if op == "extend" else 1
                items = [(rnd.randint(0, 3), rnd.uniform(-5, 5), uid + i) for i in range(n)]
                uid += n
                td = TensorDict({"g": torch.tensor([i[0] for i in items]),
                                 "r": torch.tensor([i[1] for i in items]),
                                 "uid": torch.tensor([i[2] for i in items])}, [n])
                if op == "extend":
                    rb.extend(td)
                else:
                    rb.add(td[0])
                model.write(items)
            elif op == "edit" and model.slots:  # rb[slot] = item: a write the sampler is told of
                slot = rnd.choice(sorted(model.slots))
                item = (rnd.randint(0, 3), rnd.uniform(-5, 5), uid)
                uid += 1
                rb[slot] = TensorDict({"g": torch.tensor(item[0]), "r": torch.tensor(item[1]),
                                       "uid": torch.tensor(item[2])}, [])
                model.edit(slot, item)
            elif op == "sample":
                if not model.slots:
                    _refused(rb, RuntimeError, "empty", rb.sample, num)
                    continue
                batch = num * rnd.randint(1, 3)
                data, info = rb.sample(batch, return_info=True)
                _check_group_batch(model, rb.sampler, data, info, batch)
            elif op == "bad" and model.slots:
                name = "num_groups" if by_groups else "samples_per_group"
                if num > 1:
                    _refused(rb, ValueError, name, rb.sample, num * 2 + 1)
                _refused(rb, ValueError, "batch_size", rb.sample, 0)
                _refused(rb, TypeError, "batch_size", rb.sample, 2.0)
                bad_state = {"position_recency": torch.zeros(3), "recency_clock": -1}
                _refused(rb, ValueError, "position_recency|recency_clock|keys",
                         rb.sampler.load_state_dict, bad_state)
            elif op == "empty":
                rb.empty()
                model.empty()
            elif op == "restore":
                copy_ = restored(rb, make, rnd.choice(RESTORES), keep)
                assert_same(copy_.sampler.state_dict(), rb.sampler.state_dict())
                if model.slots:
                    batch = num * rnd.randint(1, 3)
                    _same_draw(rb, copy_, batch)
                    _same_draw(rb, copy_, batch)
                rb = copy_


def test_prompt_group_arguments() -> None:
    """``batch_shape`` and the refused constructor arguments, each named."""
    sampler = PromptGroupSampler(samples_per_group=2, group_key="g")
    assert sampler.batch_shape(6) == (3, 2)
    assert PromptGroupSampler(num_groups=3).batch_shape(6) == (3, 2)
    for bad, exc in ((0, ValueError), (-1, ValueError), (True, TypeError), (1.0, TypeError)):
        with pytest.raises(exc, match="num_groups"):
            PromptGroupSampler(num_groups=bad)
    with pytest.raises(TypeError, match="num_groups or samples_per_group"):
        PromptGroupSampler(num_groups=1, samples_per_group=1)
    with pytest.raises(ValueError, match="strategy"):
        PromptGroupSampler(num_groups=1, strategy="best")


def test_prompt_group_string_groups_in_tensor_and_stack_storages(tmp_path: Any) -> None:
    # string group keys are non-tensor entries: a LazyTensorStorage keeps them, as TorchRL's
    # (it refused them before), and so does a LazyStackStorage; a batch is two whole groups
    for storage in (LazyTensorStorage(10), LazyStackStorage(10)):
        rb = TensorDictReplayBuffer(storage=storage, batch_size=4,
                                    sampler=PromptGroupSampler(num_groups=2, group_key="p"))
        for i in range(4):
            rb.add(TensorDict({"p": "ab"[i % 2], "x": torch.tensor(i)}, []))
        batch = rb.sample()
        assert sorted(batch["x"].tolist()) == [0, 1, 2, 3]
        assert sorted(batch["p"]) == ["a", "a", "b", "b"]
    # a memory-mapped storage (mapped by other processes) refuses them by name, nothing written
    rb = TensorDictReplayBuffer(storage=LazyMemmapStorage(10, scratch_dir=tmp_path),
                                batch_size=4,
                                sampler=PromptGroupSampler(num_groups=2, group_key="p"))
    with pytest.raises(TypeError, match="entry 'p' is a NonTensorData"):
        rb.add(TensorDict({"p": "a", "x": torch.tensor(0)}, []))
    assert len(rb) == 0 and not rb.storage.initialized


# ============================================================================================
# StalenessAwareSampler
# ============================================================================================
def even_only(staleness: torch.Tensor) -> torch.Tensor:
    """Weight 1 for even staleness, 0 for odd (a weight fn with zeros)."""
    return (staleness.remainder(2) == 0).float()


def linear_decay(staleness: torch.Tensor) -> torch.Tensor:
    return (4.0 - staleness.clamp_min(0)).clamp_min(0.0)


WEIGHT_FNS = {"default": None, "even": even_only, "decay": linear_decay}


def _model_weight(name: str, s: float) -> float:
    if name == "default":
        return 1.0 / (max(s, 0.0) + 1.0)
    if name == "even":
        return 1.0 if s % 2 == 0 else 0.0
    return max(4.0 - max(s, 0.0), 0.0)


@pytest.mark.parametrize("seed", SEEDS)
def test_staleness_history(seed: int) -> None:
    rnd = random.Random(1000 + seed)
    fn_name = list(WEIGHT_FNS)[seed % 3]
    max0 = rnd.choice([-1, 0, 1, 3])

    def make() -> TensorDictReplayBuffer:
        sampler = StalenessAwareSampler(max_staleness=max0,
                                        staleness_weight_fn=WEIGHT_FNS[fn_name])
        return TensorDictReplayBuffer(storage=LazyTensorStorage(CAPACITY), sampler=sampler,
                                      generator=torch.Generator().manual_seed(seed))

    rb = make()
    versions: dict[int, int] = {}
    cursor, consumer, max_st, uid = 0, 0, max0, 0
    keep: list[Any] = []
    for _ in range(45):
        op = rnd.choices(["extend", "add", "consumer", "incr", "max", "sample", "bad", "empty",
                          "restore"], [4, 2, 2, 1, 1, 7, 1, 0.4, 1])[0]
        if op in ("extend", "add"):
            n = rnd.randint(1, 4) if op == "extend" else 1
            vs = [rnd.randint(0, 6) for _ in range(n)]
            td = TensorDict({"policy_version": torch.tensor(vs),
                             "uid": torch.arange(uid, uid + n)}, [n])
            uid += n
            rb.extend(td) if op == "extend" else rb.add(td[0])
            for v in vs:
                versions[cursor] = v
                cursor = (cursor + 1) % CAPACITY
        elif op == "consumer":
            consumer = rnd.randint(0, 8)
            rb.sampler.consumer_version = consumer
        elif op == "incr":
            rb.sampler.increment_consumer_version()
            consumer += 1
        elif op == "max":
            max_st = rnd.choice([-1, 0, 1, 2, 4])
            rb.sampler.max_staleness = max_st
        elif op == "sample":
            batch = rnd.randint(1, 6)
            if not versions:
                _refused(rb, RuntimeError, "empty", rb.sample, batch)
                continue
            stale = {s: float(consumer - v) for s, v in versions.items()}
            within = [s for s in stale if max_st < 0 or stale[s] <= max_st]
            drawable = [s for s in within if _model_weight(fn_name, stale[s]) > 0]
            if not within:
                _refused(rb, RuntimeError, "max_staleness", rb.sample, batch)
                continue
            if not drawable:
                _refused(rb, ValueError, "weight 0", rb.sample, batch)
                continue
            data = rb.sample(batch)
            index = data["index"].tolist()
            assert set(data.keys()) == {"index", "policy_version", "staleness", "uid"}
            assert data["staleness"].dtype == torch.float32
            assert data["index"].dtype == torch.long and data.batch_size == (batch,)
            assert set(index) <= set(drawable), (index, drawable)
            if batch <= len(drawable):
                assert len(set(index)) == batch, "drawn without replacement"
            assert data["staleness"].tolist() == [stale[s] for s in index]
            assert data["policy_version"].tolist() == [versions[s] for s in index]
        elif op == "bad":
            _refused(rb, ValueError, "consumer_version", setattr, rb.sampler, "consumer_version", -1)
            _refused(rb, TypeError, "consumer_version", setattr, rb.sampler, "consumer_version", 1.5)
            _refused(rb, ValueError, "max_staleness", setattr, rb.sampler, "max_staleness", -2)
            _refused(rb, TypeError, "max_staleness", setattr, rb.sampler, "max_staleness", "3")
            _refused(rb, ValueError, "consumer_version",
                     rb.sampler.load_state_dict, {"consumer_version": -3, "max_staleness": 1})
            _refused(rb, ValueError, "max_staleness",
                     rb.load_state_dict, {**rb.state_dict(), "_sampler": {
                         "consumer_version": 1, "max_staleness": 2.5}})
            if versions:
                _refused(rb, ValueError, "batch_size", rb.sample, 0)
        elif op == "empty":
            rb.empty()
            versions, cursor, consumer = {}, 0, 0
        elif op == "restore":
            copy_ = restored(rb, make, rnd.choice(RESTORES), keep)
            assert copy_.sampler.consumer_version == consumer
            assert copy_.sampler.max_staleness == max_st
            if versions:
                try:
                    _same_draw(rb, copy_, 3)
                except (RuntimeError, ValueError):
                    pass  # nothing to draw: both refuse (checked in "sample")
            rb = copy_
        assert rb.sampler.consumer_version == consumer


# ============================================================================================
# Schedulers
# ============================================================================================
EPS = 1e-8


class SchedModel:
    """Expected parameter value after ``k`` steps of each scheduler spec."""

    def __init__(self, specs: list[dict[str, Any]], initial: dict[str, float]) -> None:
        self.specs = specs
        self.values = dict(initial)
        self.inits = [initial[s["param"]] for s in specs]
        self.k = 0

    def step(self) -> None:
        self.k += 1
        for spec, init in zip(self.specs, self.inits, strict=True):
            cur = self.values[spec["param"]]
            lo = spec.get("min_value")
            hi = spec.get("max_value")
            if spec["kind"] == "linear":
                n, final = spec["num_steps"], spec["final_value"]
                new = final if self.k >= n else init + (final - init) / n * self.k
            else:
                new = cur
                if self.k % spec["n_steps"] == 0:
                    new = cur + spec["gamma"] if spec["mode"] == "additive" \
                        else cur * spec["gamma"]
                new = min(max(new, -math.inf if lo is None else lo),
                          math.inf if hi is None else hi)
            self.values[spec["param"]] = new


def _random_specs(rnd: random.Random) -> list[dict[str, Any]]:
    specs = []
    for param in rnd.sample(["alpha", "beta"], rnd.randint(1, 2)):
        if rnd.random() < 0.5:
            specs.append({"kind": "linear", "param": param,
                          "final_value": rnd.choice([0.0, 0.3, 1.0, 1.5]),
                          "num_steps": rnd.randint(1, 6)})
        else:
            mode = rnd.choice(["multiplicative", "additive"])
            gamma = rnd.choice([0.5, 0.9, 1.2]) if mode == "multiplicative" \
                else rnd.choice([-0.2, 0.1, 0.25])
            spec = {"kind": "step", "param": param, "gamma": gamma,
                    "n_steps": rnd.randint(1, 3), "mode": mode, "min_value": 0.05}
            if rnd.random() < 0.5:
                spec["max_value"] = 1.3
            specs.append(spec)
    return specs


def _build(rb: ReplayBuffer, specs: list[dict[str, Any]], as_tensor: bool) -> SchedulerList:
    scheds = []
    for spec in specs:
        if spec["kind"] == "linear":
            final = torch.tensor(spec["final_value"]) if as_tensor else spec["final_value"]
            scheds.append(LinearScheduler(rb, spec["param"], final_value=final,
                                          num_steps=spec["num_steps"]))
        else:
            bounds = {k: spec[k] for k in ("min_value", "max_value") if k in spec}
            scheds.append(StepScheduler(rb, spec["param"], gamma=spec["gamma"],
                                        n_steps=spec["n_steps"], mode=spec["mode"], **bounds))
    return SchedulerList(scheds)


def _check_weights(rb: ReplayBuffer, prios: dict[int, float], data: TensorDict) -> None:
    alpha, beta = float(rb.sampler.alpha), float(rb.sampler.beta)
    stored = {s: (q + EPS) ** alpha for s, q in prios.items()}
    p_min = min(stored.values())
    index = data["index"].tolist()
    assert set(index) <= set(prios)
    assert data["priority_weight"].dtype == torch.float32
    expected = [(stored[s] / p_min) ** -beta for s in index]
    assert data["priority_weight"].tolist() == pytest.approx(expected, rel=2e-3, abs=1e-6)


@pytest.mark.parametrize("seed", SEEDS)
def test_scheduler_history(seed: int) -> None:
    rnd = random.Random(2000 + seed)
    specs = _random_specs(rnd)
    as_tensor = seed % 2 == 1
    alpha0, beta0 = rnd.choice([0.6, 0.7, 1.0]), rnd.choice([0.4, 0.5])

    def make_pair() -> tuple[ReplayBuffer, SchedulerList]:
        a = torch.tensor(alpha0) if as_tensor else alpha0
        b = torch.tensor(beta0, dtype=torch.float64) if as_tensor else beta0
        rb = TensorDictPrioritizedReplayBuffer(alpha=a, beta=b, eps=EPS,
                                               storage=LazyTensorStorage(CAPACITY),
                                               generator=torch.Generator().manual_seed(seed))
        return rb, _build(rb, specs, as_tensor)

    rb, sl = make_pair()
    # a tensor alpha / beta stays a tensor (as TorchRL), a number a float
    kind = torch.Tensor if as_tensor else float
    assert isinstance(rb.sampler.alpha, kind) and isinstance(rb.sampler.beta, kind)
    model = SchedModel(specs, {"alpha": float(rb.sampler.alpha), "beta": float(rb.sampler.beta)})
    prios: dict[int, float] = {}
    cursor = 0
    keep: list[Any] = []
    for _ in range(40):
        op = rnd.choices(["extend", "sample", "update", "step", "bad", "empty", "restore"],
                         [3, 4, 2, 4, 1, 0.3, 1.2])[0]
        if op == "extend":
            n = rnd.randint(1, 4)
            slots = rb.extend(TensorDict({"obs": torch.randn(n)}, [n]))
            q = [rnd.uniform(0.1, 3.0) for _ in range(n)]
            rb.update_priority(slots, torch.tensor(q))
            for s, v in zip(slots.tolist(), q, strict=True):
                prios[s] = v
            assert slots.tolist() == [(cursor + i) % CAPACITY for i in range(n)]
            cursor = (cursor + n) % CAPACITY
        elif op == "sample" and prios:
            _check_weights(rb, prios, rb.sample(rnd.randint(1, 5)))
        elif op == "update" and prios:
            slots = rnd.sample(sorted(prios), rnd.randint(1, len(prios)))
            q = [rnd.uniform(0.1, 3.0) for _ in slots]
            rb.update_priority(torch.tensor(slots), torch.tensor(q))
            prios.update(zip(slots, q, strict=True))
        elif op == "step":
            sl.step()
            model.step()
        elif op == "bad":
            _refused(rb, ValueError, "num_steps",
                     LinearScheduler, rb, "beta", final_value=1.0, num_steps=0)
            _refused(rb, ValueError, "no_such",
                     LinearScheduler, rb, "no_such", final_value=1.0, num_steps=2)
            _refused(rb, ValueError, "mode", StepScheduler, rb, "beta", mode="power")
            _refused(rb, ValueError, "min_value",
                     StepScheduler, rb, "beta", min_value=2.0,
                     max_value=1.0)
            _refused(rb, TypeError, "final_value",
                     LinearScheduler, rb, "beta",
                     final_value=torch.ones(2), num_steps=2)
            state = sl.state_dict()
            broken = copy.deepcopy(state)
            broken[str(len(specs) - 1)]["step_count"] = -1
            _refused(rb, ValueError, "step_count", sl.load_state_dict, broken)
            assert_same(sl.state_dict(), state)
            _refused(rb, ValueError, "alpha", setattr, rb.sampler, "alpha", -0.5)
        elif op == "empty":
            rb.empty()
            prios, cursor = {}, 0
        elif op == "restore":
            how = rnd.choice(RESTORES)
            if how in ("state_dict", "dumps"):
                made: list[SchedulerList] = []

                def make(made: list[SchedulerList] = made) -> ReplayBuffer:
                    new_rb, new_sl = make_pair()
                    made.append(new_sl)
                    return new_rb

                copy_rb = restored(rb, make, how, keep)
                copy_sl = made[0]
            elif how == "pickle":
                copy_rb, copy_sl = pickle.loads(pickle.dumps((rb, sl)))
            else:
                copy_rb, copy_sl = copy.deepcopy((rb, sl))
            assert_same(copy_sl.state_dict(), sl.state_dict())
            assert_same(copy_rb.sampler.state_dict(), rb.sampler.state_dict())
            for _ in range(2):
                sl.step()
                copy_sl.step()
                assert copy_rb.sampler.alpha == rb.sampler.alpha
                assert copy_rb.sampler.beta == rb.sampler.beta
                if prios:
                    _same_draw(rb, copy_rb, 4)
            model.step()
            model.step()
            rb, sl = copy_rb, copy_sl
        assert isinstance(rb.sampler.alpha, kind) and isinstance(rb.sampler.beta, kind)
        assert float(rb.sampler.alpha) == pytest.approx(model.values["alpha"], rel=1e-5,
                                                        abs=1e-7)
        assert float(rb.sampler.beta) == pytest.approx(model.values["beta"], rel=1e-5, abs=1e-7)
        for i, sched in enumerate(sl.schedulers):
            assert sched.step_count == model.k, i
        assert rb.state_dict()["_stateful"].keys() == {f"scheduler.{s['param']}" for s in specs}


def test_scheduler_step_refused_by_sampler_changes_nothing() -> None:
    rb = TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.4, storage=LazyTensorStorage(8))
    rb.extend(TensorDict({"obs": torch.arange(4.0)}, [4]))
    sched = StepScheduler(rb, "alpha", gamma=-1.0, mode="additive")
    state = sched.state_dict()
    _refused(rb, ValueError, "alpha", sched.step)
    assert_same(sched.state_dict(), state)


def test_scheduler_list_step_refused_changes_nothing() -> None:
    rb = TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.4, storage=LazyTensorStorage(8))
    rb.extend(TensorDict({"obs": torch.arange(4.0)}, [4]))
    schedulers = SchedulerList([LinearScheduler(rb, "beta", final_value=1.0, num_steps=6),
                                StepScheduler(rb, "alpha", gamma=-1.0, mode="additive")])
    state = schedulers.state_dict()
    _refused(rb, ValueError, "alpha", schedulers.step)
    assert_same(schedulers.state_dict(), state)
