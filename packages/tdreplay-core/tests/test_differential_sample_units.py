"""Differential fuzzing of the ``Sequence`` sample unit against a Python model.

Seeded random histories (extends that wrap the ring, in-place edits ``rb[i] = x`` of data
and done flags, restores through state_dict / dumps / pickle / deepcopy) are applied to a
``TensorDictReplayBuffer(sample_unit=Sequence(...))`` and to a model of the ring (slots
oldest first, each with its done flag). After every step, every stored slot is expanded as an
anchor and the records and ``validity_mask`` are compared with the model's window: the stored
steps around the anchor, inside one episode (``pad``/``stop``) or the written steps
(``include_reset``), never across the newest/oldest seam, clamped and invalid outside. A
sample's ``obs`` must be the stored rows at its ``index``.
"""

from __future__ import annotations

import random

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import Sequence, TensorDictReplayBuffer
from tdreplay.core.testing import restored

storages = pytest.importorskip("tdreplay.storages", reason="needs tdreplay-storages")


def model_window(order, done, p, unit):
    n = len(order)
    if unit.episode_boundary == "include_reset":
        s, e = 0, n - 1
    else:
        s = p
        while s > 0 and not done[order[s - 1]]:
            s -= 1
        e = p
        while e < n - 1 and not done[order[e]]:
            e += 1
    shift = 0
    if unit.episode_boundary == "stop":
        need = unit.dilation * (unit.length + unit.bootstrap - 1) - (e - p)
        shift = min(max(need, 0), p - s)
    q = p - shift
    recs, val = [], []
    for k in range(unit.window):
        t = q + (k - unit.burn_in) * unit.dilation
        val.append(s <= t <= e)
        recs.append(order[min(max(t, s), e)])
    return recs, val


def run_history(seed, keep):
    rng = random.Random(seed)
    cap = rng.randint(3, 12)
    unit = Sequence(length=rng.randint(1, 4),
                    episode_boundary=rng.choice(["pad", "stop", "include_reset"]),
                    burn_in=rng.randint(0, 2), bootstrap=rng.randint(0, 2),
                    dilation=rng.randint(1, 2))
    cls = rng.choice([storages.LazyTensorStorage, storages.LazyMemmapStorage])

    def make():
        return TensorDictReplayBuffer(storage=cls(cap), batch_size=3, sample_unit=unit)

    rb = make()
    obs, done, written, uid = {}, {}, 0, 0
    for _ in range(10):
        r = rng.random()
        if r < 0.6 or written == 0:
            n = rng.randint(1, cap + 2)
            d = torch.tensor([rng.random() < 0.3 for _ in range(n)])
            o = torch.arange(uid, uid + n, dtype=torch.float32)
            uid += n
            rb.extend(TensorDict({"obs": o, ("next", "done"): d[:, None]}, [n]))
            for i in range(n):
                obs[(written + i) % cap], done[(written + i) % cap] = float(o[i]), bool(d[i])
            written += n
        elif r < 0.8:
            i, flag = rng.randrange(min(written, cap)), rng.random() < 0.5
            rb[i] = TensorDict({"obs": torch.tensor(float(uid)),
                                ("next", "done"): torch.tensor([flag])}, [])
            obs[i], done[i] = float(uid), flag
            uid += 1
        else:
            rb = restored(rb, make, rng.choice(["state_dict", "dumps", "pickle", "deepcopy"]),
                          keep)
        n = min(written, cap)
        order = [(written - n + j) % cap for j in range(n)]
        index, info = unit.expand(torch.tensor(order), {}, rb.storage)
        index = index.reshape(n, -1).tolist()
        valid = info["validity_mask"].reshape(n, -1).tolist()
        for p in range(n):
            assert (index[p], valid[p]) == model_window(order, done, p, unit), (seed, p)
        stored = rb.storage[:]
        assert stored["obs"].tolist() == [obs[s] for s in range(n)]
        batch = rb.sample()
        assert torch.equal(batch["obs"], stored["obs"][batch["index"]])


@pytest.mark.parametrize("block", range(4))
def test_sequence_windows_match_model(block):
    keep: list = []
    for seed in range(block * 6, block * 6 + 6):
        run_history(seed, keep)


def test_sequence_pad_doc_example():
    done = torch.zeros(20, 1, dtype=torch.bool)
    done[[9, 19]] = True
    rb = TensorDictReplayBuffer(storage=storages.LazyTensorStorage(20), batch_size=2,
                                sample_unit=Sequence(length=3, burn_in=1))
    rb.extend(TensorDict({"obs": torch.arange(20.0), ("next", "done"): done}, [20]))
    index, info = Sequence(length=3, episode_boundary="pad").expand(
        torch.tensor([8]), {}, rb.storage)
    assert index.tolist() == [8, 9, 9]
    assert info["validity_mask"].tolist() == [True, True, False]
