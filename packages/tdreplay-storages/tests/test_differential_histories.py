"""Differential tests: configurations that must behave identically, driven through the same
histories (writes, samples, priority updates, restores by ``state_dict`` / ``dumps`` / pickling),
compared after every step.

The first tests are focused reproductions of divergences such histories found (each failed
before its fix: copies of a tensor layout, of a prioritized sampler's write generations, a
compressed storage's codec, and ``add`` into a ListStorage); the last ones guard the behaviours
that agree.
"""

from __future__ import annotations

import copy
import pickle
import random

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import (
    ListStorage,
    RandomSampler,
    ReplayBuffer,
    SamplerWithoutReplacement,
    TensorDictReplayBuffer,
)
from tdreplay.core.testing import restored
from tdreplay.samplers import PrioritizedSampler, PrioritizedSliceSampler
from tdreplay.storages import CompressedListStorage, LazyMemmapStorage, LazyTensorStorage

_COPIES = {"pickle": lambda obj: pickle.loads(pickle.dumps(obj)), "deepcopy": copy.deepcopy}


# ---- focused reproductions ----------------------------------------------------------------------

def test_compressed_list_storage_buffer_pickles():
    # the storages guide: a non-shareable storage still copies with pickle.dumps / deepcopy
    rb = ReplayBuffer(storage=CompressedListStorage(4))
    rb.extend(torch.arange(3))
    copied = pickle.loads(pickle.dumps(rb))
    assert len(copied) == 3
    assert torch.equal(torch.as_tensor(copied[:]), torch.arange(3))
    copied.add(torch.tensor(7))
    assert len(copied) == 4 and len(rb) == 3


@pytest.mark.parametrize("how", sorted(_COPIES))
def test_ndim2_tensor_storage_copy_keeps_writing_its_rows(how):
    # a copied ndim=2 LazyTensorStorage must store what is written after the copy
    # (as the original and a LazyMemmapStorage do), not read back uninitialized memory
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8, ndim=2))
    rb.extend(TensorDict({"obs": torch.tensor([[1.0, 2.0], [3.0, 4.0]])}, [2, 2]))
    rb2 = _COPIES[how](rb)
    rb2.extend(TensorDict({"obs": torch.tensor([[5.0], [6.0]])}, [2, 1]))
    assert len(rb2) == 6
    assert rb2[:]["obs"].tolist() == [[1.0, 2.0, 5.0], [3.0, 4.0, 6.0]]
    rb.extend(TensorDict({"obs": torch.tensor([[5.0], [6.0]])}, [2, 1]))
    assert rb2.state_dict()["_storage"] is not None
    assert torch.equal(rb2[:]["obs"], rb[:]["obs"])


@pytest.mark.parametrize("how", sorted(_COPIES))
def test_prioritized_sampler_copy_keeps_write_generations(how):
    # the write generations of a copied PrioritizedSampler must follow the writes made after
    # the copy, so that its state_dict loads (and stale updates stay detectable after a restore)
    def make():
        return TensorDictReplayBuffer(storage=LazyTensorStorage(6),
                                      sampler=PrioritizedSampler(6, 0.7, 0.5))

    rb = make()
    rb.extend(TensorDict({"x": torch.arange(1.0)}, [1]))
    rb2 = _COPIES[how](rb)
    rb.extend(TensorDict({"x": torch.arange(3.0)}, [3]))
    rb2.extend(TensorDict({"x": torch.arange(3.0)}, [3]))
    sd, sd2 = rb.sampler.state_dict(), rb2.sampler.state_dict()
    assert sd2["write_generation"].tolist() == sd["write_generation"].tolist()
    restored = make()
    restored.load_state_dict(rb2.state_dict())  # ValueError: priorities and write_generation disagree
    assert len(restored) == 4


def test_ndim1_tensor_storage_deepcopy_keeps_writing_its_rows():
    # same as above with a plain 1-dimensional storage: a deepcopy writes where it does not read
    rb = ReplayBuffer(storage=LazyTensorStorage(4))
    rb.extend(torch.tensor([1.0, 2.0]))
    rb2 = copy.deepcopy(rb)
    rb2.extend(torch.tensor([3.0, 4.0]))
    assert rb2[:].tolist() == [1.0, 2.0, 3.0, 4.0]
    assert sorted(set(rb2.sample(64).tolist())) <= [1.0, 2.0, 3.0, 4.0]


@pytest.mark.parametrize("how", sorted(_COPIES))
def test_prioritized_slice_sampler_copy_applies_fresh_updates(how):
    # after a copy, samples of a PrioritizedSliceSampler carry the write generations of before
    # the copy, so updating the priorities of a fresh sample is skipped as stale, silently
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8), batch_size=4,
                                sampler=PrioritizedSliceSampler(8, 1.0, 0.5, num_slices=2,
                                                                traj_key="episode"))
    rb.extend(TensorDict({"x": torch.arange(8.0), "episode": torch.arange(8) // 4}, [8]))
    rb = _COPIES[how](rb)
    rb.extend(TensorDict({"x": torch.arange(8.0), "episode": torch.arange(8) // 4 + 2}, [8]))
    sample = rb.sample()
    assert sample["write_generation"].tolist() == [2, 2, 2, 2]
    sample["td_error"] = torch.full((4,), 3.0)
    rb.update_tensordict_priority(sample)
    priorities = rb.sampler.state_dict()["priorities"][sample["index"]]
    assert torch.allclose(priorities, torch.full((4,), 3.0, dtype=priorities.dtype))


@pytest.mark.parametrize("storage", [ListStorage, LazyTensorStorage, CompressedListStorage])
def test_add_stores_no_index_entry(storage):
    # migrating guide (mig-index): ``index`` is never stored as data, and the caller's
    # TensorDict is left as it was (a ListStorage buffer's add() stores that TensorDict itself)
    rb = TensorDictReplayBuffer(storage=storage(5))
    td = TensorDict({"x": torch.tensor(1.0)}, [])
    rb.add(td)
    assert sorted(td.keys()) == ["x"]  # as TorchRL 0.14.1, which writes a shallow copy
    assert sorted(rb.storage[0].keys()) == ["x"]
    rb.add(TensorDict({"x": torch.tensor(2.0)}, []))
    assert sorted(rb[:].keys()) == ["x"]


# ---- guard: histories on which the configurations agree -----------------------------------------

_N = 5


def _batch(size: int, base: int) -> TensorDict:
    return TensorDict({
        "obs": torch.arange(size * 3, dtype=torch.float32).reshape(size, 3) + base,
        "action": torch.arange(size, dtype=torch.int64) + base,
        ("next", "done"): (torch.arange(size) % 2 == 0).unsqueeze(-1),
    }, [size])


_STORAGES = {
    "lazy": lambda: LazyTensorStorage(_N),
    "memmap": lambda: LazyMemmapStorage(_N),
    "list": lambda: ListStorage(_N),
    "compressed": lambda: CompressedListStorage(_N),
}
_SAMPLERS = {
    "random": RandomSampler,
    "without_replacement": SamplerWithoutReplacement,
    "prioritized": lambda: PrioritizedSampler(_N, 0.7, 0.5),
}


def _as_plain(x):
    if isinstance(x, list):
        x = torch.stack(x)
    if hasattr(x, "items"):
        return {k: (v.dtype, v.tolist()) for k, v in x.items(True, True)}
    return (x.dtype, x.tolist())



@pytest.mark.parametrize("sampler", sorted(_SAMPLERS))
def test_storages_agree_through_random_histories(sampler):
    """Every storage, restored at random points by state_dict or dumps (each its own way),
    behaves as a LazyTensorStorage buffer that is never restored: same slots returned, lengths,
    write counts, cursors, contents and seeded samples."""
    def maker(kind):
        return lambda: TensorDictReplayBuffer(
            storage=_STORAGES[kind](), sampler=_SAMPLERS[sampler](), batch_size=3,
            generator=torch.Generator().manual_seed(1234))

    makers = {"reference": maker("lazy"), **{k: maker(k) for k in _STORAGES}}
    for seed in range(3):
        rng = random.Random(seed)
        rbs = {k: make() for k, make in makers.items()}
        keep: list = []
        base = 0
        for step in range(30):
            op = rng.choice(["add", "extend", "extend", "setitem", "sample", "sample",
                             "priority", "restore", "empty"])
            base += 100
            size = rng.randint(1, 2 * _N)
            length = len(rbs["reference"])
            index = (torch.tensor(rng.sample(range(length), rng.randint(1, length)))
                     if length else None)
            how = {k: rng.choice(["state_dict", "dumps"]) for k in rbs}
            results = {}
            for kind in list(rbs):
                rb = rbs[kind]
                out = None
                if op == "add":
                    out = _as_plain(torch.as_tensor(rb.add(_batch(1, base)[0])))
                elif op == "extend":
                    out = _as_plain(rb.extend(_batch(size, base)))
                elif op == "setitem" and index is not None:
                    rb[index] = _batch(len(index), base)
                elif op in ("sample", "priority") and length:
                    s = rb.sample()
                    if op == "priority" and sampler == "prioritized":
                        s.set("td_error", ((s["index"] * 7) % 5 + 1).float() / 3)
                        rb.update_tensordict_priority(s)
                    out = _as_plain(s)
                elif op == "restore" and kind != "reference":
                    rbs[kind] = rb = restored(rb, makers[kind], how[kind], keep)
                elif op == "empty":
                    rb.empty()
                contents = _as_plain(rb[:]) if len(rb) else None
                results[kind] = (out, len(rb), rb.write_count, int(rb.writer.cursor), contents)
            for kind, result in results.items():
                assert result == results["reference"], (seed, step, op, kind)


@pytest.mark.parametrize("how", ["pickle", "state_dict", "dumps"])
def test_ndim2_storages_agree(how):
    """ndim=2 LazyTensorStorage, LazyMemmapStorage and dim_extend=0 (fed the transposed
    batches) agree with a model of the documented time-major layout."""
    envs, max_size = 2, 12
    rows = max_size // envs

    def makers():
        return {
            "lazy": lambda: TensorDictReplayBuffer(storage=LazyTensorStorage(max_size, ndim=2)),
            "memmap": lambda: TensorDictReplayBuffer(storage=LazyMemmapStorage(max_size, ndim=2)),
            "dim_extend0": lambda: TensorDictReplayBuffer(
                storage=LazyTensorStorage(max_size, ndim=2), dim_extend=0),
        }

    make = makers()
    rbs = {k: m() for k, m in make.items()}
    keep: list = []
    rng = random.Random(0)
    model: list = [None] * rows
    cursor = filled = 0
    base = 0
    for step in range(20):
        op = rng.choice(["extend", "extend", "restore"])
        base += 1000
        steps = rng.randint(1, 2 * rows + 1)
        data = TensorDict({"obs": torch.arange(envs * steps, dtype=torch.float32)
                           .reshape(envs, steps) + base}, [envs, steps])
        if op == "extend":
            for t in range(steps):
                model[cursor] = data[:, t]["obs"]
                cursor, filled = (cursor + 1) % rows, min(rows, filled + 1)
        for kind in list(rbs):
            rb = rbs[kind]
            if op == "extend":
                rb.extend(data if kind != "dim_extend0" else data.transpose(0, 1))
            else:
                rbs[kind] = rb = restored(rb, make[kind], how, keep)
            assert (len(rb), int(rb.writer.cursor)) == (filled * envs, cursor), (step, kind)
            assert rb.storage.shape == torch.Size([rows, envs])
            if filled:
                expected = torch.stack(model[:filled])
                assert torch.equal(rb.storage[:filled]["obs"], expected), (step, kind)
