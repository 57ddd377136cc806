"""``ReplayBufferEnsemble.end_streams``: each member's newest step becomes the end of its stream
(TorchRL's), through the member's ``update_if_present``; a refused call changes no member."""

from __future__ import annotations

import time

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ListStorage, RandomSampler, RoundRobinWriter, TensorDictReplayBuffer
from tdreplay.core.buffer_conditional import UpdateQueue
from tdreplay.core.testing import assert_same, buffer_snapshot
from tdreplay.ensembles import ReplayBufferEnsemble
from tdreplay.samplers import SliceSampler
from tdreplay.storages import LazyTensorStorage

DONE, TERMINATED, TRUNCATED = ("next", "done"), ("next", "terminated"), ("next", "truncated")


def _member(capacity=8, sampler=None, storage=None, track=True):
    return TensorDictReplayBuffer(
        storage=storage if storage is not None else LazyTensorStorage(capacity),
        sampler=sampler if sampler is not None else SliceSampler(slice_len=2, end_key=DONE),
        writer=RoundRobinWriter(track_generations=track))


def _steps(n, start=0, done=None, terminated=None, truncated=None, **extra):
    """``n`` steps with ``obs`` = start, start + 1, ... and the flags given (all False when
    ``None``; not stored when ``False``), plus the ``extra`` entries."""
    flags = {DONE: done, TERMINATED: terminated, TRUNCATED: truncated}
    data = {"obs": torch.arange(start, start + n, dtype=torch.float32)}
    for key, value in flags.items():
        if value is not False:  # False: the entry is not stored
            data[key] = (torch.zeros(n, 1, dtype=torch.bool) if value is None
                         else torch.tensor(value, dtype=torch.bool).reshape(n, 1))
    data.update(extra)
    return TensorDict(data, [n])


def _flags(rb, key=DONE):
    return rb[:][key].flatten().tolist()


def _snapshots(members):
    return [(buffer_snapshot(m), m[:].clone() if len(m.storage) else None) for m in members]


# ---- what changes ---------------------------------------------------------------------------------


def test_torchrl_example_marks_the_last_step_only():
    member = _member()
    member.extend(_steps(3, truncated=False, terminated=False))
    before = member[:].clone()
    ReplayBufferEnsemble(member).end_streams()
    after = member[:]
    assert _flags(member) == [False, False, True]
    assert torch.equal(after["obs"], before["obs"])
    assert member.write_count == 3
    assert member.writer.generations_of(torch.arange(3)).tolist() == [0, 0, 0]


def test_the_tail_is_the_step_before_the_cursor_once_wrapped():
    member = _member(capacity=4)
    member.extend(_steps(6))  # rows 0, 1 rewritten: the newest step is in row 1
    ReplayBufferEnsemble(member).end_streams()
    assert _flags(member) == [False, True, False, False]
    assert _flags(member, TRUNCATED) == [False, True, False, False]
    assert member[:]["obs"].tolist() == [4.0, 5.0, 2.0, 3.0]


@pytest.mark.parametrize(("tail", "expected_truncated"), [
    ({"done": [False], "terminated": [False], "truncated": [False]}, [True]),  # unfinished
    ({"done": [True], "terminated": [True], "truncated": [False]}, [False]),  # terminated
    ({"done": [False], "terminated": [True], "truncated": [False]}, [False]),  # terminal flag
    ({"done": [True], "terminated": [False], "truncated": [True]}, [True]),  # kept
    ({"done": [False], "terminated": False, "truncated": [False]}, [True]),  # no terminated
])
def test_truncated_is_set_only_for_unfinished_tails(tail, expected_truncated):
    member = _member()
    member.extend(_steps(2, terminated=False if tail["terminated"] is False else None))
    member.extend(_steps(1, start=2, **tail))
    ReplayBufferEnsemble(member).end_streams()
    assert _flags(member) == [False, False, True]
    assert _flags(member, TRUNCATED) == [False, False, *expected_truncated]
    if tail["terminated"] is not False:
        assert _flags(member, TERMINATED)[-1] == tail["terminated"][0]  # never written


def test_truncated_key_none_leaves_truncation_alone_and_other_keys_work():
    member = _member(sampler=SliceSampler(slice_len=2, end_key="stop"))
    member.extend(_steps(3, stop=torch.zeros(3, dtype=torch.bool)))
    ReplayBufferEnsemble(member).end_streams(end_key="stop", truncated_key=None)
    assert member[:]["stop"].tolist() == [False, False, True]
    assert _flags(member, TRUNCATED) == [False, False, False]
    assert _flags(member) == [False, False, False]


def test_every_member_is_ended_and_empty_ones_are_skipped():
    members = [_member(), _member(), _member()]
    members[0].extend(_steps(3))
    members[2].extend(_steps(5))
    rb = ReplayBufferEnsemble(*members)
    rb.end_streams()
    assert _flags(members[0]) == [False, False, True]
    assert len(members[1].storage) == 0
    assert _flags(members[2]) == [False, False, False, False, True]


def test_a_member_listed_twice_is_patched_once():
    member = _member()
    member.extend(_steps(2))
    ReplayBufferEnsemble(member, member).end_streams()
    assert _flags(member) == [False, True] and _flags(member, TRUNCATED) == [False, True]


def test_slices_never_join_the_old_tail_to_the_steps_after_the_restart():
    member = _member(capacity=16)
    member.extend(_steps(4))
    ReplayBufferEnsemble(member).end_streams()
    member.extend(_steps(4, start=4))  # the restarted producer goes on writing
    index = member.sample(200)["index"].reshape(-1, 2)
    pairs = {tuple(row) for row in index.tolist()}
    assert (3, 4) not in pairs
    assert {(0, 1), (4, 5)} <= pairs


def test_pending_submitted_updates_are_applied_first(monkeypatch):
    member = _member()
    index = member.extend(_steps(3))
    submit = UpdateQueue.submit

    def slow(self, job):
        return submit(self, lambda: (time.sleep(0.3), job())[1])

    monkeypatch.setattr(UpdateQueue, "submit", slow)
    future = member.submit_update_if_present(index=index,
                                             generation=member.writer.generations_of(index),
                                             patch={"obs": torch.full((3,), 7.0)})
    ReplayBufferEnsemble(member).end_streams()
    assert future.done() and future.result().updated_count == 3
    assert member[:]["obs"].tolist() == [7.0] * 3 and _flags(member) == [False, False, True]


def test_one_trajectory_id_per_member_is_accepted():
    member = _member(sampler=SliceSampler(slice_len=2, traj_key="env"))
    member.extend(_steps(3, env=torch.full((3,), 4)))
    ReplayBufferEnsemble(member).end_streams()
    assert _flags(member) == [False, False, True]


# ---- refused: nothing changes in any member -------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"end_key": DONE, "truncated_key": DONE}, ValueError, "distinct"),
    ({"terminated_key": "x", "truncated_key": ("x",)}, ValueError, "distinct"),
    ({"end_key": 3}, TypeError, "end_key"),
    ({"truncated_key": ["a", 1]}, TypeError, "truncated_key"),
])
def test_bad_keys_are_refused(kwargs, error, match):
    member = _member()
    member.extend(_steps(3))
    before = _snapshots([member])
    with pytest.raises(error, match=match):
        ReplayBufferEnsemble(member).end_streams(**kwargs)
    assert_same(_snapshots([member]), before)


def _bad_member(kind):
    if kind == "two-dim storage":
        rb = _member(storage=LazyTensorStorage(8, ndim=2))
        rb.extend(_steps(4).reshape(2, 2))
    elif kind == "list storage":
        rb = _member(storage=ListStorage(8))
        rb.extend(_steps(2))
    elif kind == "untracked writer":
        rb = _member(track=False)
        rb.extend(_steps(2))
    elif kind == "random sampler":
        rb = _member(sampler=RandomSampler())
        rb.extend(_steps(2))
    elif kind == "other end key":
        rb = _member(sampler=SliceSampler(slice_len=2, end_key="stop"))
        rb.extend(_steps(2, stop=torch.zeros(2, dtype=torch.bool)))
    elif kind == "no end entry":
        rb = _member()
        rb.extend(_steps(2, done=False))
    elif kind == "integer end flag":
        rb = _member()
        rb.extend(_steps(2, done=False).set(DONE, torch.zeros(2, 1, dtype=torch.long)))
    elif kind == "integer truncated flag":
        rb = _member()
        rb.extend(_steps(2, truncated=False).set(TRUNCATED, torch.zeros(2, 1)))
    else:  # several trajectory ids
        rb = _member(sampler=SliceSampler(slice_len=2, traj_key="env"))
        rb.extend(_steps(4, env=torch.tensor([0, 0, 1, 1])))
    return rb


@pytest.mark.parametrize(("kind", "error", "match"), [
    ("two-dim storage", RuntimeError, "member 1 needs a one-dimensional storage"),
    ("list storage", RuntimeError, "member 1 needs a storage patched in place"),
    ("untracked writer", RuntimeError, "track_generations=True"),
    ("random sampler", RuntimeError, "slice sampler reading end_key"),
    ("other end key", RuntimeError, "slice sampler reading end_key"),
    ("no end entry", KeyError, "member 1 stores no end_key"),
    ("integer end flag", TypeError, "boolean end_key"),
    ("integer truncated flag", TypeError, "boolean truncated_key"),
    ("several trajectory ids", RuntimeError, "several trajectory ids"),
])
def test_a_bad_member_is_refused_before_any_member_changes(kind, error, match):
    good, later = _member(), _member()
    good.extend(_steps(3))
    later.extend(_steps(2))
    bad = _bad_member(kind)
    members = [good, bad, later]
    before = _snapshots(members)
    with pytest.raises(error, match=match):
        ReplayBufferEnsemble(*members).end_streams()
    assert_same(_snapshots(members), before)
    assert _flags(good) == [False, False, False]
