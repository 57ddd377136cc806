"""Differential tests of ``ReplayBufferEnsemble``: seeded random histories of extends and adds
into its member buffers, ensemble samples (``sample_from_all``, ``p`` with
``num_buffer_sampled``, ``num_buffer_sampled`` alone), priority updates through the ensemble,
``empty`` of the ensemble or of one member, and restores of the ensemble (``state_dict``,
``dumps``, pickling, ``deepcopy``).

After every step each member's contents, ``len`` and ``write_count`` are compared with a
round-robin model of that member, every sampled item with what the model holds at its
``("index", "index")`` in buffer ``("index", "buffer_ids")``, and the samples of an ensemble
restored at random points with those of one never restored, drawn with the same seeds
(``torch.manual_seed`` and ``np.random.seed``: a prioritized sampler without a generator draws
from NumPy's global generator, as TorchRL's), whether the randomness comes from the global
generators, the ensemble's generator or each member's own.

The first tests are focused reproductions of divergences these histories found (fixed: the
member buffers' generators and transforms' state in the ensemble's state); the last one guards
the behaviours that agree.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import (
    ListStorage,
    RandomSampler,
    SamplerWithoutReplacement,
    TensorDictReplayBuffer,
)
from tdreplay.core.testing import restored
from tdreplay.ensembles import ReplayBufferEnsemble
from tdreplay.samplers import PrioritizedSampler
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage
from tdreplay.transforms import VecNorm


def _data(n: int, base: float) -> TensorDict:
    return TensorDict({"obs": torch.arange(n, dtype=torch.float32) + base}, [n])



# ---- focused reproductions ----------------------------------------------------------------------

def test_state_dict_restores_member_generators():
    # design: state_dict / dumps restore everything "so a restored buffer samples exactly as
    # the saved one would"; the ensembles guide: dumps restores "the generators", and
    # ensemble.dumps / loads does (test_dumps_loads_restores_member_generators); a member
    # buffer's own state_dict has "_rng". TorchRL 0.14.1 samples alike after this round trip.
    def build():
        members = [TensorDictReplayBuffer(storage=LazyTensorStorage(10),
                                          generator=torch.Generator().manual_seed(i))
                   for i in range(2)]
        return ReplayBufferEnsemble(*members, sample_from_all=True, batch_size=8)

    rb = build()
    rb[0].extend(_data(10, 0))
    rb[1].extend(_data(10, 10))
    for _ in range(3):
        rb.sample()
    twin = build()
    twin.load_state_dict(rb.state_dict())
    assert torch.equal(twin.sample()["obs"], rb.sample()["obs"])


@pytest.mark.parametrize("how", ["state_dict", "dumps"])
def test_restore_keeps_member_transform_state(how):
    # a member buffer's own state_dict / dumps save its transforms' state (writers_transforms
    # guide: "a buffer's state_dict() / dumps save them with its storage, sampler and writer");
    # the ensemble's drops it, so the restored member normalises with fresh statistics
    def build():
        normalised = TensorDictReplayBuffer(storage=LazyTensorStorage(10),
                                            transform=VecNorm(in_keys=["obs"], decay=0.9))
        plain = TensorDictReplayBuffer(storage=LazyTensorStorage(10))
        return ReplayBufferEnsemble(normalised, plain, sample_from_all=True, batch_size=4,
                                    generator=torch.Generator().manual_seed(0))

    rb = build()
    rb[0].extend(_data(10, 0) * 3)
    rb[1].extend(_data(10, 0))
    for _ in range(3):
        rb.sample()
    twin = restored(rb, build, how, [])
    saved = {k: v.tolist() for k, v in rb[0].transform[0].state_dict().items()}
    assert {k: v.tolist() for k, v in twin[0].transform[0].state_dict().items()} == saved
    assert torch.equal(twin.sample()["obs"], rb.sample()["obs"])


# ---- guard: histories on which the ensembles agree ----------------------------------------------

_CAPACITIES = [6, 5, 7]
_OPTIONS = {
    "sample_from_all": {"sample_from_all": True},
    "p": {"p": [0.2, 0.3, 0.5], "num_buffer_sampled": 4},
    "num_buffer_sampled": {"num_buffer_sampled": 2},
}


def _members(generators: str) -> list[TensorDictReplayBuffer]:
    def gen(i):
        return torch.Generator().manual_seed(100 + i) if generators == "member" else None

    return [
        TensorDictReplayBuffer(storage=LazyTensorStorage(6), sampler=RandomSampler(),
                               generator=gen(0)),
        TensorDictReplayBuffer(storage=ListStorage(5), sampler=SamplerWithoutReplacement(),
                               generator=gen(1)),
        TensorDictReplayBuffer(storage=LazyMemmapStorage(7),
                               sampler=PrioritizedSampler(7, 0.7, 0.5), generator=gen(2)),
    ]


def _plain(sample):
    if isinstance(sample, list):  # parts that do not stack (e.g. an epoch's short last part)
        return [_plain(part) for part in sample]
    return {k: v.tolist() for k, v in sample.items(True, True)}


def _items(sample) -> list[tuple[float, int, int]]:
    """(value, slot, buffer id) of every sampled item."""
    out = []
    for part in (sample if isinstance(sample, list) else [sample]):
        out += zip(part["obs"].reshape(-1).tolist(), part["index", "index"].reshape(-1).tolist(),
                   part["index", "buffer_ids"].reshape(-1).tolist())
    return out


@pytest.mark.parametrize("generators", ["global", "ensemble", "member"])
@pytest.mark.parametrize("option", sorted(_OPTIONS))
def test_ensemble_histories_agree_with_member_models(option, generators):
    """Members follow their round-robin models, samples read what the models hold, and an
    ensemble restored at random points samples as one never restored (by state_dict, dumps,
    pickling or deepcopy)."""
    def make():
        kwargs = dict(_OPTIONS[option])
        if generators == "ensemble":
            kwargs["generator"] = torch.Generator().manual_seed(5)
        return ReplayBufferEnsemble(*_members(generators), batch_size=12, **kwargs)

    hows = ["state_dict", "dumps", "pickle", "deepcopy"]
    for seed in range(2):
        rng = random.Random(seed)
        ref, twin = make(), make()
        keep: list = []
        models: list[list] = [[None] * c for c in _CAPACITIES]
        cursor, filled, written = [0, 0, 0], [0, 0, 0], [0, 0, 0]
        base = 0
        for step in range(40):
            op = rng.choices(["extend", "add", "sample", "priority", "restore", "empty",
                              "member_empty"], [4, 1, 4, 1, 1.5, 0.2, 0.3])[0]
            i = step if step < 3 else rng.randrange(3)  # every member filled first
            op = "extend" if step < 3 else op
            n = 1 if op == "add" else rng.randint(1, 9)
            base += 100
            data = _data(n, base)
            if op in ("extend", "add"):
                for value in data["obs"].tolist():
                    models[i][cursor[i]] = value
                    cursor[i] = (cursor[i] + 1) % _CAPACITIES[i]
                    filled[i] = min(_CAPACITIES[i], filled[i] + 1)
                written[i] += n
            elif op == "empty":
                cursor, filled, written = [0, 0, 0], [0, 0, 0], [0, 0, 0]
            elif op == "member_empty":
                cursor[i] = filled[i] = written[i] = 0
            how = rng.choice(hows)
            draw_seed = rng.randrange(2**31)
            samples = []
            for which in ("ref", "twin"):
                rb = ref if which == "ref" else twin
                where = (option, generators, seed, step, op, which)
                out = None
                if op == "extend":
                    rb[i].extend(data.clone())
                elif op == "add":
                    rb[i].add(data[0].clone())
                elif op in ("sample", "priority") and all(filled):
                    torch.manual_seed(draw_seed)
                    np.random.seed(draw_seed % 2**32)
                    sample = rb.sample()
                    out = _plain(sample)
                    for value, slot, buffer_id in _items(sample):
                        assert models[buffer_id][slot] == value, where
                    if op == "priority":  # the parts of the prioritized member (2)
                        parts = sample if isinstance(sample, list) else list(sample.unbind(0))
                        index = [p["index"] for p in parts if p["index", "buffer_ids"][0] == 2]
                        priority = [(x["index"] % 5 + 1).float() / 3 for x in index]
                        if index:
                            rb.update_priority(index, priority)
                elif op == "restore" and which == "twin":
                    twin = rb = restored(rb, make, how, keep)
                elif op == "empty":
                    rb.empty()
                elif op == "member_empty":
                    rb[i].empty()
                for j, member in enumerate(rb.buffers):
                    got = member[:]["obs"].tolist() if len(member) else []
                    assert got == models[j][: filled[j]], (*where, j)
                    assert (len(member), member.write_count) == (filled[j], written[j]), \
                        (*where, j)
                assert rb.write_count == sum(written), where
                samples.append(out)
            assert samples[0] == samples[1], (option, generators, seed, step, op)
