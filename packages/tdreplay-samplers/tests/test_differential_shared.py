"""Model-based fuzzing of buffers shared between forked processes.

Seeded plans drive forked workers (``multiprocessing.get_context("fork")``) that extend a shared
buffer, some wrapping the ring several times, while the parent (the learner) samples and
updates priorities in between; queues sequence the phases so each run is deterministic. After
every phase the learner's priority trees (``rb.prioritized_sampler``: per-slot priorities from
its ``state_dict``, ``total_priority``, ``min_priority``, ``max_priority``) are compared with a
Python model of docs/guides/storages.rst ("Prioritized sampling in a shared buffer:
``sync=False``") and docs/guides/sampling.rst ("Stale priority updates are skipped"): rows
written by workers since the last catch-up get the max priority, rows the learner updated keep
their value unless overwritten since, an update computed for a row overwritten since is dropped.
Every sampled row must be whole and ``index`` must point at it. Slice samplers over a shared
storage written by workers must never cross trajectories or the newest/oldest seam.

Tests marked ``xfail(strict=True)`` pin bugs; the others are guards that agree with the model.
"""

from __future__ import annotations

import multiprocessing as mp
import random

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ReplayBuffer
from tdreplay.samplers import SliceSampler, TensorDictPrioritizedReplayBuffer
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage

FORK = mp.get_context("fork")
STORAGES = {"tensor": lambda n: LazyTensorStorage(n, shared_init=True),
            "memmap": lambda n: LazyMemmapStorage(n)}


def _rows(tags: list[int]) -> TensorDict:
    t = torch.tensor(tags, dtype=torch.float64)
    return TensorDict({"tag": t, "a": t * 2, "b": {"c": t + 0.5}}, [len(tags)])


def _serve(rb, jobs, done) -> None:
    while (tags := jobs.get()) is not None:
        try:
            rb.extend(_rows(tags))
            done.put("ok")
        except Exception as err:  # noqa: BLE001 - reported to the test
            done.put(f"{type(err).__name__}: {err}")


class _Model:
    """What the learner's trees should hold (alpha=1, eps=0: a leaf is its priority)."""

    def __init__(self, n: int) -> None:
        self.n, self.content, self.prio = n, [None] * n, [0.0] * n
        self.cursor, self.written, self.pending, self.max_set = 0, 0, set(), None
        self.next_tag = 0

    def write(self, count: int) -> list[int]:
        tags = list(range(self.next_tag, self.next_tag + count))
        self.next_tag += count
        for tag in tags:
            self.content[self.cursor] = tag
            self.pending.add(self.cursor)
            self.cursor = (self.cursor + 1) % self.n
        self.written += count
        return tags

    def catch_up(self) -> set[int]:
        caught, self.pending = self.pending, set()
        for row in caught:
            self.prio[row] = 1.0 if self.max_set is None else self.max_set
        return caught

    def update(self, index: list[int], values: list[float], stale: set[int]) -> None:
        for row, value in zip(index, values):
            if row not in stale:
                self.prio[row] = value
                self.max_set = value if self.max_set is None else max(self.max_set, value)


def _fuzz_deferred(seed: int, storage: str, n: int = 16, workers: int = 2,
                   phases: int = 10) -> list[str]:
    rng = random.Random(seed)
    rb = TensorDictPrioritizedReplayBuffer(
        alpha=1.0, beta=1.0, eps=0.0, batch_size=8, shared=True, sync=False,
        storage=STORAGES[storage](n), generator=torch.Generator().manual_seed(seed))
    jobs = [FORK.Queue() for _ in range(workers)]
    done = FORK.Queue()
    procs = [FORK.Process(target=_serve, args=(rb, jobs[w], done)) for w in range(workers)]
    for p in procs:
        p.start()
    model, errors = _Model(n), []

    def worker_write(count: int, phase: int) -> None:
        jobs[rng.randrange(workers)].put(model.write(count))
        if (reply := done.get(timeout=60)) != "ok":
            errors.append(f"phase {phase}: worker extend raised {reply}")

    try:
        for phase in range(phases):
            for _ in range(rng.randint(0, 3)):
                worker_write(rng.choice([1, 3, 5, n - 1, n, 2 * n + 3]), phase)
            if model.written == 0:
                continue
            sample = rb.sample()
            model.catch_up()
            index, tags = sample["index"].tolist(), sample["tag"].tolist()
            for row, tag, a, c in zip(index, tags, sample["a"].tolist(),
                                      sample["b", "c"].tolist()):
                if a != 2 * tag or c != tag + 0.5:
                    errors.append(f"phase {phase}: torn row tag={tag} a={a} c={c}")
                if model.content[row] != tag:
                    errors.append(f"phase {phase}: index {row} returned tag {tag}, "
                                  f"row holds {model.content[row]}")
            if rng.random() < 0.5:  # collectors overwrite sampled rows before the update
                worker_write(rng.choice([1, 2, 4, n, 2 * n + 1]), phase)
            values = [rng.choice([0.25, 0.5, 2.0, 3.0, 7.0]) for _ in index]
            sample["td_error"] = torch.tensor(values)
            rb.update_tensordict_priority(sample)
            model.update(index, values, stale=model.catch_up())
            sampler = rb.prioritized_sampler
            got = sampler.state_dict()["priorities"][:n].tolist()
            bad = [(i, g, m) for i, (g, m) in enumerate(zip(got, model.prio)) if abs(g - m) > 1e-9]
            if bad:
                errors.append(f"phase {phase}: (slot, tree, model) differ: {bad}")
            if abs(sampler.total_priority - sum(model.prio)) > 1e-6:
                errors.append(f"phase {phase}: total {sampler.total_priority} != {sum(model.prio)}")
            least = min(p for p in model.prio if p > 0)
            if abs(sampler.min_priority - least) > 1e-9:
                errors.append(f"phase {phase}: min {sampler.min_priority} != {least}")
            if model.max_set is not None and abs(sampler.max_priority - model.max_set) > 1e-9:
                errors.append(f"phase {phase}: max {sampler.max_priority} != {model.max_set}")
            if len(rb) != min(model.written, n):
                errors.append(f"phase {phase}: len {len(rb)} != {min(model.written, n)}")
    finally:
        for q in jobs:
            q.put(None)
        for p in procs:
            p.join(20)
    return errors


@pytest.mark.parametrize("storage", sorted(STORAGES))
@pytest.mark.parametrize("seed", range(6))
def test_deferred_priorities_match_model(seed: int, storage: str) -> None:
    assert _fuzz_deferred(seed, storage) == []


def _run(fn, *args) -> None:
    proc = FORK.Process(target=fn, args=args)
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0


def _deferred(n: int = 4, **kw) -> TensorDictPrioritizedReplayBuffer:
    return TensorDictPrioritizedReplayBuffer(
        alpha=1.0, beta=1.0, eps=0.0, batch_size=4, shared=True, sync=False,
        storage=LazyTensorStorage(n, shared_init=True),
        generator=torch.Generator().manual_seed(0), **kw)


def _x(value: float, count: int) -> TensorDict:
    return TensorDict({"x": torch.full((count,), float(value))}, [count])


def test_stale_update_after_worker_extend_is_dropped() -> None:
    rb = _deferred()
    _run(lambda: rb.extend(_x(1, 4)))
    sample = rb.sample()
    assert sample["index"].tolist() == [3, 2, 1, 3]
    _run(lambda: rb.extend(_x(9, 1)))  # slot 0 overwritten, never sampled
    _run(lambda: rb.extend(_x(9, 3)))  # slots 1, 2, 3 overwritten after the sample
    sample["td_error"] = torch.full((4,), 50.0)
    rb.update_tensordict_priority(sample)
    assert rb.prioritized_sampler.state_dict()["priorities"].tolist() == [1.0] * 4


def test_worker_empty_then_extend_restarts_trees() -> None:
    rb = _deferred()
    _run(lambda: rb.extend(_x(1, 4)))
    rb.update_priority(torch.arange(4), torch.tensor([1.0, 9.0, 2.0, 3.0]))
    _run(lambda: (rb.empty(), rb.extend(_x(3, 2))))
    sample = rb.sample()
    assert len(rb) == 2 and set(sample["index"].tolist()) <= {0, 1}
    assert sample["x"].tolist() == [3.0] * 4
    assert rb.prioritized_sampler.state_dict()["priorities"].tolist() == [1.0, 1.0, 0.0, 0.0]


def test_learner_and_worker_writes_interleave() -> None:
    rb = _deferred()
    rb.extend(_x(1, 2))
    _run(lambda: rb.extend(_x(2, 3)))  # slots 2, 3, 0
    rb.sample()
    assert rb.sampler.caught_up == 5
    assert rb[:]["x"].tolist() == [2.0, 1.0, 2.0, 2.0]
    assert rb.prioritized_sampler.state_dict()["priorities"].tolist() == [1.0] * 4


def test_worker_index_assignment_is_refused() -> None:
    # the learner catches up with the writer's shared counters, which an index assignment in a
    # worker does not move: the new item would keep the replaced one's priority (and a stale
    # update would land on it). The worker's assignment is refused before anything is written
    rb = _deferred()
    _run(lambda: rb.extend(_x(1, 4)))
    sample = rb.sample()
    errors = FORK.Queue()

    def assign() -> None:
        try:
            rb[3] = _x(9, 1)[0]
        except RuntimeError as err:
            errors.put(str(err))
        else:
            errors.put(None)

    _run(assign)
    assert "in a worker of a sync=False prioritized buffer" in (errors.get(timeout=60) or "")
    assert rb[3]["x"].item() == 1.0  # nothing written
    sample["td_error"] = torch.full((4,), 50.0)
    rb.update_tensordict_priority(sample)  # the rows still hold the sampled items
    assert all(p in (1.0, 50.0) for p in rb.prioritized_sampler.state_dict()["priorities"].tolist())
    rb[3] = _x(9, 1)[0]  # in the learner: the new item gets the max priority
    assert rb[3]["x"].item() == 9.0
    assert rb.prioritized_sampler.state_dict()["priorities"][3].item() == 50.0


def _fuzz_slices(seed: int, storage: str, by_done: bool, n: int = 24) -> list[str]:
    rng = random.Random(seed)
    key = {"end_key": "done"} if by_done else {"traj_key": "traj"}
    rb = ReplayBuffer(storage=STORAGES[storage](n), batch_size=6, shared=True,
                      sampler=SliceSampler(slice_len=3, strict_length=True, **key))
    errors, step, traj = [], 0, 0
    for phase in range(8):
        plan = []
        for _ in range(rng.randint(1, 3)):
            plan.append((traj, rng.randint(3, 9)))
            traj += 1

        def collect(plan=plan, first=step) -> None:
            for t, length in plan:
                done = torch.zeros(length, 1, dtype=torch.bool)
                done[-1] = True
                rb.extend(TensorDict({"traj": torch.full((length,), t), "done": done,
                                      "step": torch.arange(first, first + length)}, [length]))
                first += length

        _run(collect)
        step += sum(length for _, length in plan)
        try:
            batch = rb.sample()
        except Exception as err:  # noqa: BLE001 - reported to the test
            errors.append(f"phase {phase}: {err!r}")
            continue
        for t, s in zip(batch["traj"].reshape(-1, 3).tolist(),
                        batch["step"].reshape(-1, 3).tolist()):
            if len(set(t)) != 1 or s != list(range(s[0], s[0] + 3)):
                errors.append(f"phase {phase}: slice crosses a boundary: traj {t} steps {s}")
    return errors


@pytest.mark.parametrize("by_done", [False, True], ids=["traj_key", "end_key"])
@pytest.mark.parametrize("storage", sorted(STORAGES))
@pytest.mark.parametrize("seed", range(3))
def test_shared_slices_stay_in_one_trajectory(seed: int, storage: str, by_done: bool) -> None:
    assert _fuzz_slices(seed, storage, by_done) == []
