"""Differential (model-based) fuzzing of write generations and of two buffer transforms.

- Writer generations (``track_generations=True``: ``generations_of``, ``"index_generation"``,
  ``update_if_present``) and the prioritized sampler's ``write_generation`` (stale priority
  updates skipped), on ``RoundRobinWriter`` / ``TensorDictRoundRobinWriter`` over
  ``LazyTensorStorage`` and ``ListStorage``, and ``TensorDictMaxValueWriter`` (sampler
  generations only), against a pure-Python model: per slot its item, writer generation,
  sampler version and priority. Seeded histories of extend / add / sample / priority updates
  (with and without ``write_generation``) / ``update_if_present`` / empty, with restored copies
  (:data:`~tdreplay.core.testing.RESTORES`) taken at random points that must go on exactly like
  the original (same handles, same seeded draws, same state). Bad arguments must raise a clear
  error naming the argument and leave the buffer unchanged.
- ``PolicyAgeFilter``: exactly the rows whose policy age exceeds the limit are dropped, on writes
  and on samples; ``NextStateReconstructor``: ``("next", obs)`` rebuilt exactly where the next
  sample row is the next step.

The first tests are focused reproductions of divergences found (xfail until fixed).
The tensor storages, prioritized samplers and buffer transforms come from tdreplay-storages,
-samplers and -transforms (tdreplay-writers' ``test`` extra).
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from tdreplay import samplers, storages, transforms, writers
from tdreplay.core import ListStorage, ReplayBuffer, RoundRobinWriter, TensorDictReplayBuffer
from tdreplay.core.testing import RESTORES, assert_same, buffer_snapshot, restored

SEEDS = range(12)
CAP = 5



# ---- focused reproductions ---------------------------------------------------------------------
def test_setitem_advances_writer_generation():
    rb = TensorDictReplayBuffer(storage=storages.LazyTensorStorage(4),
                                writer=writers.TensorDictRoundRobinWriter(track_generations=True))
    index = rb.extend(TensorDict({"x": torch.zeros(4)}, [4]))
    handle = rb.writer.generations_of(index)
    rb[1] = TensorDict({"x": torch.tensor(5.0), "index": torch.tensor(1)}, [])  # new record
    result = rb.update_if_present(index=index, generation=handle,
                                  patch={"x": torch.full((4,), 7.0)})
    assert rb[:]["x"].tolist() == [7.0, 5.0, 7.0, 7.0]  # row 1 was rewritten: skipped
    assert result.updated.tolist() == [True, False, True, True]


def test_policy_age_filter_add_drops_stale_item():
    rb = TensorDictReplayBuffer(storage=storages.LazyTensorStorage(4),
                                transform=transforms.PolicyAgeFilter(5, max_policy_lag=1))
    rb.add(TensorDict({"policy_version": torch.tensor(0)}, []))  # age 5 > 1
    assert len(rb) == 0


def test_next_state_random_sample_does_not_invent():
    # a random sample of one trajectory 0..7: rows 5 and 2, in that order
    sample = TensorDict({"observation": torch.tensor([[5.0], [2.0]]), "index": torch.tensor([5, 2]),
                         ("collector", "traj_ids"): torch.zeros(2, dtype=torch.long),
                         ("next", "done"): torch.zeros(2, 1, dtype=torch.bool)}, [2])
    out = transforms.NextStateReconstructor(index_key="index")(sample)
    assert out["next", "observation"][0].isnan().all()     # actual: 2.0 (row 2's obs)


# ---- generations: model ------------------------------------------------------------------------
class Model:
    """Per slot: item uid, writer generation (-1 never), sampler version, priority."""

    def __init__(self, cap, tracks):
        self.cap, self.tracks = cap, tracks
        self.uid = [None] * cap
        self.gen = [-1] * cap
        self.ver = [0] * cap
        self.prio = [0.0] * cap
        self.cursor = self.length = self.write_count = 0
        self.max_p = None
        self.clock = 0

    def new_priority(self):
        return 1.0 if self.max_p is None else self.max_p

    def write(self, rows, uids):
        self.clock += 1
        for r, u in zip(rows, uids):
            self.uid[r] = u
            self.gen[r] += 1
            self.ver[r] = self.clock
            self.prio[r] = self.new_priority()
        self.write_count += len(uids)

    def assign(self, rows, uids):
        """``rb[r] = x``: the rows' data and generations change, their priorities stay (as
        TorchRL's); updates of the priorities sampled before are stale."""
        self.clock += 1
        for r, u in zip(rows, uids):
            self.uid[r] = u
            self.gen[r] += 1
            self.ver[r] = self.clock

    def extend(self, uids):
        rows = [(self.cursor + i) % self.cap for i in range(len(uids))]
        self.write(rows, uids)
        self.cursor = (self.cursor + len(uids)) % self.cap
        self.length = min(self.cap, self.length + len(uids))
        return rows

    def update(self, rows, prios, vers=None):
        for i, (r, p) in enumerate(zip(rows, prios)):
            if vers is not None and vers[i] != self.ver[r]:
                continue
            self.prio[r] = p
            self.max_p = p if self.max_p is None else max(self.max_p, p)

    def empty(self):
        self.gen = [g + 1 if g >= 0 else -1 for g in self.gen]
        self.clock += 1
        self.ver = [0] * self.cap
        self.prio = [0.0] * self.cap
        self.uid = [None] * self.cap
        self.cursor = self.length = self.write_count = 0
        self.max_p = None


def _make_gen_buffer(kind, tracks):

    def make():
        sampler = samplers.PrioritizedSampler(CAP, alpha=1.0, beta=1.0)
        if kind == "list":
            return ReplayBuffer(storage=ListStorage(CAP), sampler=sampler, batch_size=3,
                                writer=RoundRobinWriter(track_generations=tracks))
        writer = (writers.TensorDictRoundRobinWriter if kind == "lazy-td" else
                  RoundRobinWriter)(track_generations=tracks)
        return TensorDictReplayBuffer(storage=storages.LazyTensorStorage(CAP), sampler=sampler,
                                      writer=writer, batch_size=3)
    return make


def _batch(kind, uids):
    if kind == "list":
        return [torch.tensor(u) for u in uids]
    t = torch.tensor(uids, dtype=torch.long)
    return TensorDict({"uid": t, "x": t.float()}, [len(uids)])


def _uids_of(kind, rb):
    data = rb[:]
    if kind == "list":
        return [int(d) for d in data]
    return data["uid"].tolist()


def _check(rb, m, kind):
    n = m.length
    assert len(rb) == n and rb.write_count == m.write_count
    assert rb.writer.cursor == m.cursor
    if n:
        assert _uids_of(kind, rb) == m.uid[:n]
    gens = rb.writer.generations_of(torch.arange(CAP)).tolist()
    assert gens == (m.gen if m.tracks else [-1] * CAP)
    prios = rb.sampler.state_dict()["priorities"][:CAP].tolist()
    for r in range(CAP):
        want = m.prio[r] + rb.sampler.eps if r < n else 0.0
        assert abs(prios[r] - want) < 1e-5, (r, prios, m.prio)
    # sampler generations: equal exactly where the model's versions are equal
    sgen = rb.sampler.slot_generation(torch.arange(n)).tolist()
    for i in range(n):
        for j in range(n):
            assert (sgen[i] == sgen[j]) == (m.ver[i] == m.ver[j])


def _seed(seed):
    torch.manual_seed(seed)
    np.random.seed(seed)  # CPU prioritized draws come from NumPy's generator (as TorchRL's)


def _sample(rb, kind, seed):
    _seed(seed)
    if kind == "list":
        data, info = rb.sample(return_info=True)
        return {"uid": [int(d) for d in data], **{k: v.clone() for k, v in info.items()}}
    s = rb.sample()
    return {"uid": s["uid"].tolist(), **{k: s[k].clone() for k in s.keys()
                                          if k in ("index", "index_generation",
                                                   "write_generation")}}


def _run_gen_history(seed, kind, tracks, setitem=False):
    rng = random.Random(seed)
    make = _make_gen_buffer(kind, tracks)
    rb, m = make(), Model(CAP, tracks)
    twin = None  # a restored copy, driven alongside
    held = []  # samples / handles taken earlier, used later (maybe stale)
    next_uid = 0
    keep = []
    for step in range(32):
        bufs = [rb] if twin is None else [rb, twin]
        op = rng.choice(["extend", "extend", "add", "sample", "sample", "upd_gen", "upd_gen",
                         "upd_plain", "upd_td", "patch", "patch", "empty", "restore", "bad"]
                        + (["setitem"] * 3 if setitem else []))
        if op == "empty" and rng.random() < 0.6:
            op = "extend"
        if op in ("upd_gen", "upd_plain", "upd_td", "patch", "setitem") and not m.length:
            op = "extend"
        if op == "extend":
            n = rng.randint(1, CAP + 2)
            uids = list(range(next_uid, next_uid + n))
            next_uid += n
            want = m.extend(uids)
            for b in bufs:
                assert b.extend(_batch(kind, uids)).tolist() == want
            if tracks:
                # the handle of this extend, as generations_of reports it
                held.append({"index": torch.tensor(want),
                             "index_generation": rb.writer.generations_of(torch.tensor(want))})
        elif op == "add":
            uid = next_uid
            next_uid += 1
            want = m.extend([uid])[0]
            item = torch.tensor(uid) if kind == "list" else _batch(kind, [uid])[0]
            for b in bufs:
                assert int(b.add(item)) == want
        elif op == "setitem":
            r = rng.randrange(m.length)
            uid = next_uid
            next_uid += 1
            m.assign([r], [uid])  # (not counted: a write of the buffer, not of the writer)
            if kind == "list":
                item = torch.tensor(uid)
            else:
                item = _batch(kind, [uid])[0]
                if kind == "lazy-td":
                    item["index"] = torch.tensor(r)
            for b in bufs:
                b[r] = item
        elif op == "sample":
            if not m.length:
                for b in bufs:
                    with pytest.raises(RuntimeError):
                        b.sample()
                continue
            got = [_sample(b, kind, seed * 1000 + step) for b in bufs]
            s = got[0]
            for other in got[1:]:
                assert_same(other, s)
            idx = s["index"].tolist()
            assert s["uid"] == [m.uid[i] for i in idx]
            if tracks:
                assert s["index_generation"].tolist() == [m.gen[i] for i in idx]
            else:
                assert "index_generation" not in s
            s["ver"] = [m.ver[i] for i in idx]
            held.append(s)
        elif op in ("upd_gen", "upd_plain", "upd_td"):
            samples = [h for h in held if "write_generation" in h]
            if not samples:
                continue
            s = rng.choice(samples)
            idx = s["index"].tolist()
            if any(i >= m.length for i in idx):
                continue  # unwritten slots: refused (checked in the bad-argument test)
            prios = [round(rng.uniform(0.05, 3.0), 2) for _ in idx]
            pt = torch.tensor(prios)
            if op == "upd_plain":
                m.update(idx, [float(p) for p in pt])
            else:
                m.update(idx, [float(p) for p in pt], s["ver"])
            for b in bufs:
                if op == "upd_gen":
                    b.sampler.update_priority(s["index"], pt, storage=b.storage,
                                              write_generation=s["write_generation"])
                elif op == "upd_plain":
                    b.update_priority(s["index"], pt)
                elif kind == "list":
                    b.sampler.update_priority(s["index"], pt, storage=b.storage,
                                              write_generation=s["write_generation"])
                else:
                    b.update_tensordict_priority(TensorDict(
                        {"index": s["index"], "write_generation": s["write_generation"],
                         "td_error": pt}, [len(idx)]))
        elif op == "patch":
            handles = [h for h in held if "index_generation" in h]
            if kind == "list" or not tracks:
                for b in bufs:
                    before = buffer_snapshot(b)
                    with pytest.raises(RuntimeError, match="conditional updates"):
                        b.update_if_present(index=torch.tensor([0]),
                                            generation=torch.tensor([0]),
                                            patch={"x": torch.zeros(1)})
                    assert_same(buffer_snapshot(b), before)
                continue
            if not handles:
                continue
            h = rng.choice(handles)
            idx, hg = h["index"].tolist(), h["index_generation"].tolist()
            values = [float(rng.randint(100, 999)) for _ in idx]
            live = [hg[k] >= 0 and hg[k] == m.gen[i] and i < m.length
                    for k, i in enumerate(idx)]
            before_x = rb[:]["x"].tolist() if m.length else []
            want_x = list(before_x)
            for k, i in enumerate(idx):
                if live[k]:
                    want_x[i] = values[k]  # (repeated slots: the last one wins)
            for b in bufs:
                res = b.update_if_present(index=h["index"], generation=h["index_generation"],
                                          patch={"x": torch.tensor(values)})
                assert res.updated.tolist() == live
                assert res.stale_count == live.count(False)
                if m.length:
                    got = b[:]["x"].tolist()
                    for i in range(m.length):
                        assert got[i] == want_x[i] or (
                            idx.count(i) > 1 and got[i] in values), (got, want_x)
                    assert b[:]["uid"].tolist() == m.uid[:m.length]
            if m.length and len(set(idx)) == len(idx):
                assert rb[:]["x"].tolist() == want_x
        elif op == "empty":
            m.empty()
            for b in bufs:
                b.empty()
        elif op == "restore":
            how = rng.choice(RESTORES)
            twin = restored(rb, make, how, keep)
            if rng.random() < 0.5:  # go on with the copy as the main one
                rb, twin = twin, rb
        elif op == "bad":
            _bad_call(rng, rb, m, kind, tracks)
        for b in ([rb] if twin is None else [rb, twin]):
            _check(b, m, kind)
        if twin is not None:
            assert_same(buffer_snapshot(twin), buffer_snapshot(rb))


def _bad_call(rng, rb, m, kind, tracks):
    before = buffer_snapshot(rb)
    case = rng.randrange(5)
    if case == 0:
        with pytest.raises(ValueError, match="priority"):
            rb.update_priority(torch.tensor([0]), torch.tensor([float("nan")]))
    elif case == 1:
        with pytest.raises(IndexError):
            rb.update_priority(torch.tensor([CAP + 3]), torch.tensor([1.0]))
    elif case == 2:
        with pytest.raises((ValueError, TypeError), match="batch_size"):
            rb.sample(batch_size=0)
    elif case == 3 and tracks and kind != "list" and m.length:
        with pytest.raises(ValueError, match="generation"):
            rb.update_if_present(index=torch.tensor([0, 1]), generation=torch.tensor([0]),
                                 patch={"x": torch.zeros(2)})
        with pytest.raises(KeyError, match="nope"):
            rb.update_if_present(index=torch.tensor([0]), generation=torch.tensor([0]),
                                 patch={"nope": torch.zeros(1)})
        with pytest.raises(ValueError, match="patch"):
            rb.update_if_present(index=torch.tensor([0]), generation=torch.tensor([0]),
                                 patch={"x": torch.zeros(3)})
    elif case == 4:
        with pytest.raises((TypeError, ValueError), match="track_generations"):
            RoundRobinWriter(track_generations="yes")
    assert_same(buffer_snapshot(rb), before)


@pytest.mark.parametrize("kind", ["lazy-td", "lazy", "list"])
@pytest.mark.parametrize("seed", SEEDS)
def test_generation_histories(seed, kind):
    _run_gen_history(seed, kind, tracks=True)


@pytest.mark.parametrize("seed", SEEDS[:8])
def test_generation_histories_untracked(seed):
    _run_gen_history(seed, "lazy-td", tracks=False)


@pytest.mark.parametrize("kind", ["lazy-td", "list"])
@pytest.mark.parametrize("seed", SEEDS[:6])
def test_setitem_histories_sampler_generations(seed, kind):
    """rb[i] = x: the sampler's generations (checked by _check) advance and the slot gets the
    new-item priority, with writer generations off (the next test tracks them)."""
    _run_gen_history(seed, kind, tracks=False, setitem=True)


def test_setitem_histories_writer_generations():
    for seed in SEEDS[:6]:
        _run_gen_history(seed, "lazy-td", tracks=True, setitem=True)


# ---- TensorDictMaxValueWriter: sampler generations only ----------------------------------------
def test_max_value_writer_tracks_no_generations():
    w = writers.TensorDictMaxValueWriter(rank_key="r")
    rb = TensorDictReplayBuffer(storage=storages.LazyTensorStorage(3), writer=w, batch_size=2)
    index = rb.extend(TensorDict({"r": torch.arange(3.0)}, [3]))
    assert not w.tracks_generations and w.generations_of(index).tolist() == [-1, -1, -1]
    assert "index_generation" not in rb.sample().keys()
    with pytest.raises(RuntimeError, match="track generations"):
        rb.update_if_present(index=index, generation=torch.zeros(3, dtype=torch.long),
                             patch={"r": torch.zeros(3)})


@pytest.mark.parametrize("seed", SEEDS[:8])
def test_max_value_stale_priority_histories(seed):
    """Top-k model of the writer; a priority update computed from a sample is skipped for the
    slots the writer replaced since."""
    rng = random.Random(seed)

    def make():
        return TensorDictReplayBuffer(
            storage=storages.LazyTensorStorage(CAP), batch_size=3,
            writer=writers.TensorDictMaxValueWriter(rank_key="r"),
            sampler=samplers.PrioritizedSampler(CAP, alpha=1.0, beta=1.0))
    rb, twin, keep = make(), None, []
    heap, uid_of, ver, prio = [], {}, {}, {}
    clock, max_p, next_uid, held = 0, None, 0, []
    for step in range(30):
        bufs = [rb] if twin is None else [rb, twin]
        op = rng.choice(["extend", "extend", "sample", "update", "update", "restore"])
        if op == "extend" or not heap:
            n = rng.randint(1, CAP + 1)
            ranks = [float(rng.randint(0, 6)) for _ in range(n)]
            uids = list(range(next_uid, next_uid + n))
            next_uid += n
            final = {}
            for p, rank in enumerate(ranks):  # TorchRL's heap of (rank, row)
                if len(heap) < CAP:
                    row = len(heap)
                    heap.append((rank, row))
                else:
                    low = min(heap)
                    if not rank > low[0]:
                        continue
                    heap.remove(low)
                    row = low[1]
                    heap.append((rank, row))
                final[row] = p
            clock += 1
            want = [-1] * n  # the slot of each batch row, -1 where not kept (TorchRL's)
            for r, p in final.items():
                want[p] = r
            for r, p in final.items():
                uid_of[r], ver[r] = uids[p], clock
                prio[r] = 1.0 if max_p is None else max_p
            td = TensorDict({"r": torch.tensor(ranks), "uid": torch.tensor(uids)}, [n])
            for b in bufs:
                assert b.extend(td).tolist() == want
        elif op == "sample":
            got = []
            for b in bufs:
                _seed(seed * 100 + step)
                got.append(b.sample())
            for g in got[1:]:
                assert_same(g, got[0])
            s = got[0]
            assert s["uid"].tolist() == [uid_of[i] for i in s["index"].tolist()]
            held.append((s, [ver[i] for i in s["index"].tolist()]))
        elif op == "update" and held:
            s, seen = rng.choice(held)
            pt = torch.tensor([round(rng.uniform(0.1, 4.0), 2) for _ in seen])
            for i, v, p in zip(s["index"].tolist(), seen, pt.tolist()):
                if ver[i] == v:
                    prio[i] = p
                    max_p = p if max_p is None else max(max_p, p)
            for b in bufs:
                b.update_tensordict_priority(TensorDict(
                    {"index": s["index"], "write_generation": s["write_generation"],
                     "td_error": pt}, [len(seen)]))
        elif op == "restore":
            twin = restored(rb, make, rng.choice(RESTORES), keep)
        for b in ([rb] if twin is None else [rb, twin]):
            n = len(heap)
            assert len(b) == n
            assert b[:]["uid"].tolist() == [uid_of[r] for r in range(n)]
            got = b.sampler.state_dict()["priorities"][:n].tolist()
            for r in range(n):
                assert abs(got[r] - prio[r] - b.sampler.eps) < 1e-5, (r, got, prio)
        if twin is not None:
            assert_same(buffer_snapshot(twin), buffer_snapshot(rb))


# ---- PolicyAgeFilter ---------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["lazy-td", "lazy"])
@pytest.mark.parametrize("seed", SEEDS[:6])
def test_policy_age_filter_histories(seed, kind):
    rng = random.Random(seed)
    now = {"v": 0}
    lag = rng.randint(0, 2)
    T = rng.choice([None, 3])  # [B] rows, or [B, T] rows (their oldest step counts)

    def make():
        writer = (writers.TensorDictRoundRobinWriter() if kind == "lazy-td"
                  else RoundRobinWriter())
        return TensorDictReplayBuffer(
            storage=storages.LazyTensorStorage(CAP), writer=writer, batch_size=4,
            transform=transforms.PolicyAgeFilter(now["v"], max_policy_lag=lag))
    rb, keep = make(), []
    ring, cursor, next_uid = [], 0, 0
    for step in range(30):
        op = rng.choice(["extend", "extend", "tick", "sample", "read", "restore"])
        if op == "extend":
            n = rng.randint(1, CAP + 1)
            shape = (n,) if T is None else (n, T)
            version = torch.randint(max(0, now["v"] - lag - 2), now["v"] + 1, shape)
            uids = torch.arange(next_uid, next_uid + n)
            next_uid += n
            oldest = version if T is None else version.min(-1).values
            fresh = [int(u) for u, o in zip(uids, oldest) if now["v"] - int(o) <= lag]
            td = TensorDict({"policy_version": version,
                             "uid": uids if T is None else uids.unsqueeze(-1).expand(n, T)},
                            [n])
            rows = rb.extend(td)
            want = [(cursor + i) % CAP for i in range(len(fresh))]
            assert rows.tolist() == want
            for r, u in zip(want, fresh):
                if r < len(ring):
                    ring[r] = (u, version[uids.tolist().index(u)])
                else:
                    ring.append((u, version[uids.tolist().index(u)]))
            cursor = (cursor + len(fresh)) % CAP
        elif op == "tick":
            now["v"] += rng.randint(0, 2)
            [age_filter] = [t for t in rb.transform.transforms
                            if isinstance(t, transforms.PolicyAgeFilter)]
            age_filter.current_version = now["v"]
        elif op == "restore":
            rb = restored(rb, make, rng.choice(RESTORES), keep)
        elif op in ("sample", "read") and ring:
            def is_fresh(r):
                return now["v"] - int(ring[r][1].min()) <= lag
            if op == "read":
                data = rb[:]
                want_rows = [r for r in range(len(ring)) if is_fresh(r)]
            else:
                torch.manual_seed(step)
                data, info = rb.sample(return_info=True)
                want_rows = [r for r in info["index"].tolist() if is_fresh(r)]
            uid = data["uid"] if T is None else data["uid"][..., 0]
            assert uid.tolist() == [ring[r][0] for r in want_rows]
            if want_rows:
                oldest = data["policy_version"].reshape(len(want_rows), -1).min(-1).values
                assert bool((now["v"] - oldest <= lag).all())
        assert len(rb) == len(ring)


# ---- NextStateReconstructor --------------------------------------------------------------------
def _trajectories(rng, n_rows):
    traj, step, done = [], [], []
    t = 0
    while len(traj) < n_rows:
        length = rng.randint(2, 9)
        for k in range(length):
            traj.append(t)
            step.append(k)
            done.append(k == length - 1)
        t += 1
    traj, step, done = traj[:n_rows], step[:n_rows], done[:n_rows]
    obs = torch.randn(n_rows, 2)
    return TensorDict({"observation": obs, ("collector", "traj_ids"): torch.tensor(traj),
                       ("next", "done"): torch.tensor(done).unsqueeze(-1),
                       "step_count": torch.tensor(step)}, [n_rows])


def _expected_next(data, stored, slice_ends):
    """NaN except where sample row i + 1 is the stored successor of row i (same trajectory,
    not done, the next stored row) and not across a slice end."""
    idx = data["index"].tolist()
    traj = stored["collector", "traj_ids"].tolist()
    done = stored["next", "done"].squeeze(-1).tolist()
    out = torch.full_like(data["observation"], float("nan"))
    for i in range(len(idx) - 1):
        a, b = idx[i], idx[i + 1]
        if (i not in slice_ends and b == a + 1 and traj[a] == traj[b] and not done[a]):
            out[i] = stored["observation"][b]
    return out


@pytest.mark.parametrize("slices", [True, False])
@pytest.mark.parametrize("seed", SEEDS[:8])
def test_next_state_reconstructor_histories(seed, slices):
    rng = random.Random(seed)
    n_rows = 40
    stored = _trajectories(rng, n_rows)
    sampler = (samplers.SliceSampler(slice_len=4, traj_key=("collector", "traj_ids"))
               if slices else samplers.RandomSampler())
    rb = TensorDictReplayBuffer(storage=storages.LazyTensorStorage(n_rows), sampler=sampler,
                                batch_size=8, transform=transforms.NextStateReconstructor(
                                    step_count_key="step_count"))
    rb.extend(stored)
    for k in range(6):
        torch.manual_seed(seed * 10 + k)
        data = rb.sample()
        ends = {3, 7} if slices else set()
        want = _expected_next(data, stored, ends)
        assert_same(data["next", "observation"], want)
        assert_same(data["observation"], stored["observation"][data["index"]])


@pytest.mark.parametrize("seed", SEEDS[:8])
def test_next_state_reconstructor_default_checks_with_slices(seed):
    rng = random.Random(seed)
    stored = _trajectories(rng, 40)
    rb = TensorDictReplayBuffer(
        storage=storages.LazyTensorStorage(40), batch_size=12,
        sampler=samplers.SliceSampler(slice_len=4, traj_key=("collector", "traj_ids")),
        transform=transforms.NextStateReconstructor())
    rb.extend(stored)
    for k in range(6):
        torch.manual_seed(seed * 10 + k)
        data = rb.sample()
        assert_same(data["next", "observation"], _expected_next(data, stored, {3, 7, 11}))


def test_next_state_reconstructor_bad_arguments():
    with pytest.raises(TypeError, match="fill_value"):
        transforms.NextStateReconstructor(fill_value="x")
    with pytest.raises(TypeError, match="keys"):
        transforms.NextStateReconstructor(keys=3)
    with pytest.raises(ValueError, match="max_policy_lag"):
        transforms.PolicyAgeFilter(3, max_policy_lag=-1)
    with pytest.raises(TypeError, match="current_version"):
        transforms.PolicyAgeFilter("3", max_policy_lag=1)
