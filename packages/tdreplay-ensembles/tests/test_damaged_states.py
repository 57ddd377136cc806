"""Damaged ensemble state_dicts are refused before anything changes: a member writer's cursor
past its storage's saved rows, a member sampler's slots past them, a member storage's damaged
entry; real states all load."""

from __future__ import annotations

import copy

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import (
    ListStorage,
    ReplayBuffer,
    SamplerWithoutReplacement,
    TensorDictReplayBuffer,
)
from tdreplay.ensembles import ReplayBufferEnsemble, StorageEnsemble
from tdreplay.storages import LazyTensorStorage


def list_ensemble():
    return ReplayBufferEnsemble(ReplayBuffer(storage=ListStorage(10)),
                                ReplayBuffer(storage=ListStorage(10),
                                             sampler=SamplerWithoutReplacement()),
                                batch_size=4, sample_from_all=True)


def tensor_ensemble():
    return ReplayBufferEnsemble(TensorDictReplayBuffer(storage=LazyTensorStorage(10)),
                                TensorDictReplayBuffer(storage=LazyTensorStorage(8)),
                                batch_size=4, sample_from_all=True)


def td(n, start=0):
    return TensorDict({"obs": torch.arange(start, start + n).float()}, [n])


def rows(m):
    if not len(m):
        return []
    return list(m[:]) if isinstance(m.storage, ListStorage) else m[:]["obs"].tolist()


def contents(rb):
    return [(rows(m), m.writer.cursor, m.write_count) for m in rb.buffers]


def filled_list(n0=7, n1=12):
    rb = list_ensemble()
    rb[0].extend(list(range(n0)))
    rb[1].extend(list(range(100, 100 + n1)))
    rb.sample()
    return rb


@pytest.mark.parametrize("damage", ["cursor-past-rows", "rows-dropped"])
def test_a_member_cursor_past_its_saved_rows_is_refused(damage):
    state = filled_list().state_dict()
    if damage == "cursor-past-rows":
        state["_writer"]["0"]["cursor"] += 1
    else:
        state["_storage"]["0"]["storage"].pop()
    dst = filled_list(3, 4)
    before = contents(dst)
    with pytest.raises(ValueError, match=r"state_dict\['_writer'\]\['0'\].*gap"):
        dst.load_state_dict(state)
    assert contents(dst) == before
    dst[0].extend([50, 51])  # the untouched buffer goes on writing
    assert list(dst[0][:]) == [0, 1, 2, 50, 51]


def test_a_damaged_member_storage_is_refused_by_the_storage_ensemble_check():
    ensemble = StorageEnsemble(ListStorage(4), ListStorage(4))
    with pytest.raises(ValueError, match="max_size"):
        ensemble.check_state_dict({"0": {"storage": [1], "max_size": 4},
                                   "1": {"storage": [1], "max_size": 5}})


@pytest.mark.parametrize("seed", range(8))
def test_states_of_random_histories_load_and_read_alike(seed):
    g = torch.Generator().manual_seed(seed)
    for make, write in ((list_ensemble, lambda m, n, s: m.extend(list(range(s, s + n)))),
                        (tensor_ensemble, lambda m, n, s: m.extend(td(n, s)))):
        rb = make()
        for step in range(int(torch.randint(1, 7, (1,), generator=g))):
            member = rb[int(torch.randint(0, 2, (1,), generator=g))]
            write(member, int(torch.randint(1, 9, (1,), generator=g)), 10 * step)
            if all(len(m) for m in rb.buffers):
                rb.sample()
        twin = make()
        twin.load_state_dict(rb.state_dict())
        assert contents(twin) == contents(rb)
        for m, t in zip(rb.buffers, twin.buffers):  # both go on writing alike
            write(m, 3, 500)
            write(t, 3, 500)
        assert contents(twin) == contents(rb)


def test_a_member_sampler_state_past_its_saved_rows_is_refused():
    # (a sampler state of another buffer: every sample of that member raised IndexError)
    from tdreplay.samplers import PrioritizedSampler

    def filled(ids):
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8),
                                    sampler=PrioritizedSampler(8, 1.0, 1.0))
        rb.extend(TensorDict({"id": torch.tensor(list(ids))}, [len(ids)]))
        return rb

    ensemble = ReplayBufferEnsemble(filled(range(4)), filled(range(10, 14)), batch_size=4)
    state = copy.deepcopy(ensemble.state_dict())
    state["_sampler"]["1"] = copy.deepcopy(filled(range(6)).state_dict()["_sampler"])
    with pytest.raises(ValueError, match=r"state_dict\['_sampler'\]\['1'\]: .*slots \[4, 5\]"):
        ensemble.load_state_dict(state)
    assert ensemble[1][:]["id"].tolist() == [10, 11, 12, 13]


def test_a_member_sampler_state_that_fails_its_check_names_the_member():
    from tdreplay.samplers import PrioritizedSampler

    def filled():
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8),
                                    sampler=PrioritizedSampler(8, 0.7, 0.5))
        rb.extend(TensorDict({"id": torch.arange(5)}, [5]))
        return rb

    ensemble = ReplayBufferEnsemble(filled(), filled(), filled(), batch_size=3)
    state = copy.deepcopy(ensemble.state_dict())
    state["_sampler"]["2"]["priorities"][0] = float("nan")
    before = copy.deepcopy(ensemble.state_dict())
    with pytest.raises(ValueError, match=r"SamplerEnsemble member 2: .*priorities.* NaN"):
        ensemble.load_state_dict(state)
    for member, saved in zip(ensemble.buffers, before["_sampler"].values()):
        torch.testing.assert_close(member.sampler.state_dict()["priorities"],
                                   saved["priorities"])
