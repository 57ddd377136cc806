"""Property tests of the slice samplers against a brute-force oracle.

Random trajectory layouts are written round-robin into flat and multi-dimensional storages
(``ndim`` 1 to 3), wrapping around, with batches sampled in between (so the incremental
bookkeeping is exercised) and occasional index assignments (which force a rebuild). After
every step the trajectories the sampler tracks must equal the oracle's, which recomputes them
from the stored steps: each step carries its environment, its time index, its trajectory id
and its done flag. Sampled slices must lie inside one oracle trajectory, be consecutive and
be marked truncated at their last step.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.samplers import SliceSampler, SliceSamplerWithoutReplacement
from tdreplay.samplers._trajectory_index import LANE, LEN, START
from tdreplay.storages import LazyTensorStorage


class Layout:
    """Generates steps for every environment and remembers how the buffer was written."""

    def __init__(self, ndim: int, envs: int, T: int, p_done: float, p_switch: float,
                 rng: np.random.Generator) -> None:
        self.ndim, self.envs, self.T = ndim, envs, T
        self.p_done, self.p_switch, self.rng = p_done, p_switch, rng
        self.state: dict[int, list[int]] = {}  # env -> [next t, current trajectory id]
        self.next_id = 0
        self.rows_per_write: list[int] = []

    def _steps(self, env: int, n: int) -> tuple[list[int], list[int], list[bool]]:
        t, ep = self.state.setdefault(env, [0, self._new_id()])
        ts, eps, dones = [], [], []
        for _ in range(n):
            done = bool(self.rng.random() < self.p_done)
            ts.append(t)
            eps.append(ep)
            dones.append(done)
            t += 1
            if done or self.rng.random() < self.p_switch:
                ep = self._new_id()
        self.state[env] = [t, ep]
        return ts, eps, dones

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def batch(self, rows: int) -> TensorDict:
        self.rows_per_write.append(rows)
        # ndim > 1: [*envs, steps] batches (``self.T`` envs on the last env dim), written along
        # the steps (dim_extend = ndim - 1) into a time-major storage, as TorchRL's
        if self.ndim == 1:
            shape, lanes = [rows], [(0, rows)]
        elif self.ndim == 2:
            shape, lanes = [self.T, rows], [(b, rows) for b in range(self.T)]
        else:
            shape = [self.envs, self.T, rows]
            lanes = [(b, rows) for b in range(self.envs * self.T)]
        env, t, ep, done = [], [], [], []
        for lane, n in lanes:
            ts, eps, dones = self._steps(lane, n)
            env += [lane] * n
            t += ts
            ep += eps
            done += dones
        def make(values: list, dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype).view(shape)
        return TensorDict({"env": make(env, torch.long), "t": make(t, torch.long),
                           "ep": make(ep, torch.long),
                           "next": {"done": make(done, torch.bool).unsqueeze(-1)}}, shape)

    @property
    def isolated(self) -> bool:
        """Never: writes of any number of steps continue every environment (time-major)."""
        return False


def oracle(storage: LazyTensorStorage, layout: Layout, use_ids: bool, use_done: bool
           ) -> set[tuple[int, ...]]:
    """Trajectories (tuples of flat slots in time order) recomputed from the stored steps."""
    n = len(storage)
    data = storage[:].reshape(-1) if storage.ndim > 1 else storage[:]
    env = data["env"].tolist()
    t = data["t"].tolist()
    ep = data["ep"].tolist()
    done = data["next", "done"].reshape(-1).tolist()
    T = storage.shape[-1] if storage.ndim > 1 else 1
    groups: dict[int, list[int]] = {}
    for slot in range(n):
        group = slot // T if layout.isolated else env[slot]
        groups.setdefault(group, []).append(slot)
    out = set()
    for slots in groups.values():
        slots.sort(key=lambda s: t[s])
        current = [slots[0]]
        for prev, s in zip(slots[:-1], slots[1:]):
            cut = (t[s] != t[prev] + 1 or (use_ids and ep[s] != ep[prev])
                   or (use_done and done[prev]))
            if cut:
                out.add(tuple(current))
                current = []
            current.append(s)
        out.add(tuple(current))
    return out


def tracked(sampler: SliceSampler, storage: LazyTensorStorage) -> set[tuple[int, ...]]:
    """Trajectories as the sampler's index holds them."""
    index = sampler._sync(storage)
    out = set()
    for r in index.live_records():
        lane, start, length = (int(x) for x in index.rec[r, [LANE, START, LEN]])
        out.add(tuple(index.slots_of(np.full(length, lane), start + np.arange(length)).tolist()))
    return out


def check_batch(batch: TensorDict, trajectories: set[tuple[int, ...]], seq_len: int,
                strict: bool, storage: LazyTensorStorage) -> None:
    slots = batch["index"].tolist()
    truncated = batch["next", "truncated"].reshape(-1).tolist()
    position = {s: (traj, i) for traj in trajectories for i, s in enumerate(traj)}
    # split the batch at its truncation marks: one slice each
    slices, current = [], []
    for s, trunc in zip(slots, truncated):
        current.append(s)
        if trunc:
            slices.append(current)
            current = []
    assert not current, "the last step of the batch must end a slice"
    for sl in slices:
        traj, i = position[sl[0]]
        assert tuple(sl) == traj[i: i + len(sl)], "slice leaves its trajectory or skips steps"
        if strict:
            assert len(sl) == seq_len
        else:
            assert len(sl) == min(seq_len, len(traj))
    stored = storage.get(batch["index"])["next", "done"]
    expected_done = stored | batch["next", "truncated"].view_as(stored)
    assert (batch["next", "done"] == expected_done).all()
    assert not batch["next", "terminated"].any()
    if strict:
        assert batch.reshape(-1, seq_len)["next", "truncated"][:, -1].all()


@st.composite
def scenarios(draw: st.DrawFn) -> dict:
    ndim = draw(st.sampled_from([1, 2, 3]))
    envs = draw(st.integers(1, 2)) if ndim == 3 else 1
    T = draw(st.integers(1, 5)) if ndim > 1 else 1
    rows_cap = draw(st.integers(1, 6)) if ndim > 1 else draw(st.integers(3, 30))
    fixed = draw(st.booleans())
    first = draw(st.integers(1, 4 if ndim > 1 else 12))
    writes = draw(st.lists(st.integers(1, 4 if ndim > 1 else 12), min_size=1, max_size=10))
    if fixed and ndim > 1:
        writes = [first] * len(writes)
    return {
        "ndim": ndim, "envs": envs, "T": T, "max_size": rows_cap * envs * T,
        "writes": writes,
        "p_done": draw(st.sampled_from([0.0, 0.1, 0.3])),
        "p_switch": draw(st.sampled_from([0.0, 0.1, 0.3])),
        "signals": draw(st.sampled_from(["ids", "done", "both"])),
        "seq_len": draw(st.integers(1, 5)),
        "strict": draw(st.booleans()),
        "sample_every": draw(st.integers(1, 3)),
        "assign": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**16)),
    }


def _sampler_kwargs(signals: str) -> dict:
    if signals == "ids":
        return {"traj_key": "ep"}
    if signals == "done":
        return {"end_key": ("next", "done")}
    return {"traj_key": "ep", "end_key": ("next", "done")}


def _sample_checked(rb: TensorDictReplayBuffer, trajectories: set, seq_len: int,
                    strict: bool) -> None:
    n = len(rb)
    longest = max(len(t) for t in trajectories)
    if strict and (seq_len > rb.storage.max_size or seq_len > n):
        with pytest.raises(ValueError, match="longer than"):
            rb.sample(4 * seq_len)
        return
    if strict and longest < seq_len:
        with pytest.raises(RuntimeError, match="sufficient length"):
            rb.sample(4 * seq_len)
        return
    check_batch(rb.sample(4 * seq_len), trajectories, seq_len, strict, rb.storage)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sc=scenarios())
def test_tracked_trajectories_match_oracle(sc: dict) -> None:
    rng = np.random.default_rng(sc["seed"])
    layout = Layout(sc["ndim"], sc["envs"], sc["T"], sc["p_done"], sc["p_switch"], rng)
    sampler = SliceSampler(slice_len=sc["seq_len"], strict_length=sc["strict"],
                           **_sampler_kwargs(sc["signals"]))
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(sc["max_size"], ndim=sc["ndim"]),
                                sampler=sampler)
    rb.set_rng(torch.Generator().manual_seed(sc["seed"]))
    use_ids = sc["signals"] in ("ids", "both")
    use_done = sc["signals"] in ("done", "both")
    for i, rows in enumerate(sc["writes"]):
        rb.extend(layout.batch(rows))
        if sc["assign"] and i % 3 == 2:
            # rewrite one stored row with a done flag set at its first step
            row = int(rng.integers(0, rb.storage._len_rows))
            item = rb.storage[row].clone()
            item["next", "done"].view(-1)[0] = True
            rb[(slice(None),) * rb.dim_extend + (row,)] = item  # storage row ``row``
        if i % sc["sample_every"] == 0 or i == len(sc["writes"]) - 1:
            expected = oracle(rb.storage, layout, use_ids, use_done)
            _sample_checked(rb, expected, sc["seq_len"], sc["strict"])
            assert tracked(sampler, rb.storage) == expected


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sc=scenarios())
def test_epoch_covers_each_trajectory_once(sc: dict) -> None:
    rng = np.random.default_rng(sc["seed"])
    layout = Layout(sc["ndim"], sc["envs"], sc["T"], sc["p_done"], sc["p_switch"], rng)
    sampler = SliceSamplerWithoutReplacement(num_slices=2, strict_length=sc["strict"],
                                             **_sampler_kwargs(sc["signals"]))
    seq_len = sc["seq_len"]
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(sc["max_size"], ndim=sc["ndim"]),
                                sampler=sampler, batch_size=2 * seq_len)
    rb.set_rng(torch.Generator().manual_seed(sc["seed"]))
    for rows in sc["writes"]:
        rb.extend(layout.batch(rows))
    trajectories = oracle(rb.storage, layout, sc["signals"] in ("ids", "both"),
                          sc["signals"] in ("done", "both"))
    eligible = {t for t in trajectories if len(t) >= seq_len or not sc["strict"]}
    if not eligible or (sc["strict"] and (seq_len > sc["max_size"] or seq_len > len(rb))):
        with pytest.raises((RuntimeError, ValueError)):
            rb.sample()
        return
    for _epoch in range(2):
        seen = []
        for batch in rb:
            check_batch(batch, trajectories, seq_len, sc["strict"], rb.storage)
            ends = batch["next", "truncated"].reshape(-1).nonzero().squeeze(-1).tolist()
            starts = [0] + [e + 1 for e in ends[:-1]]
            for a in starts:
                slot = int(batch["index"][a])
                seen.append(next(t for t in trajectories if slot in t))
        assert sorted(seen) == sorted(eligible)
        assert sampler.ran_out
