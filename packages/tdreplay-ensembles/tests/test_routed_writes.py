"""ReplayBufferEnsemble's routed writes (TorchRL 0.14.1's ``routing_key=`` / ``routing_dim=``):
``extend`` / ``add`` write each record into its member and return the handles,
``update_if_present`` / ``submit_update_if_present`` patch each handle's member, samples carry
``index_generation``; bad input changes no member.

The literals marked "TorchRL 0.14.1" are what TorchRL's ``ReplayBufferEnsemble`` returned for
the same program (``TensorDictRoundRobinWriter(track_generations=True)`` members over
``LazyTensorStorage``)."""

from __future__ import annotations

import pickle
import sys
import threading

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import (
    ConditionalUpdateResult,
    ListStorage,
    RoundRobinWriter,
    TensorDictReplayBuffer,
)
from tdreplay.core.testing import assert_same, buffer_snapshot
from tdreplay.ensembles import ReplayBufferEnsemble, WriterEnsemble
from tdreplay.samplers import PrioritizedSampler
from tdreplay.storages import LazyTensorStorage


def _member(capacity=4, track=True, storage=None, **kwargs):
    return TensorDictReplayBuffer(
        storage=storage if storage is not None else LazyTensorStorage(capacity),
        writer=RoundRobinWriter(track_generations=track), **kwargs)


def _ensemble(*capacities, track=True, **kwargs):
    return ReplayBufferEnsemble(*(_member(c, track) for c in capacities or (4, 4)), **kwargs)


def _records(x, m):
    x, m = torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(m)
    return TensorDict({"x": x, "m": m}, batch_size=x.shape)


def _xs(rb):
    return [rb[i][:]["x"].tolist() if len(rb[i]) else [] for i in range(len(rb))]


def _snapshots(rb):
    return [buffer_snapshot(member) for member in rb.buffers]


def _assert_handles(handles, buffer_ids, index, generation=None):
    keys = {"buffer_ids", "index"} | ({"index_generation"} if generation is not None else set())
    assert set(handles.keys()) == keys
    assert handles.batch_size == torch.Size([len(buffer_ids)])
    for key, expected in (("buffer_ids", buffer_ids), ("index", index),
                          ("index_generation", generation)):
        if expected is not None:
            value = handles[key]
            assert value.dtype == torch.int64 and value.shape == (len(expected),), key
            assert value.tolist() == expected, key


# ---- extend / add ------------------------------------------------------------------------------


def test_routing_key_extend_writes_each_record_into_its_member():
    rb = _ensemble(routing_key="m")
    handles = rb.extend(_records(torch.arange(6.0), [1, 0, 1, 1, 0, 1]))
    # TorchRL 0.14.1: buffer_ids [1, 0, 1, 1, 0, 1], index [0, 0, 1, 2, 1, 3], generations 0
    _assert_handles(handles, [1, 0, 1, 1, 0, 1], [0, 0, 1, 2, 1, 3], [0] * 6)
    assert _xs(rb) == [[1.0, 4.0], [0.0, 2.0, 3.0, 5.0]]  # TorchRL 0.14.1
    assert [m.write_count for m in rb.buffers] == [2, 4]  # TorchRL 0.14.1
    # a record's handle reads back the record itself
    for i, (member, slot) in enumerate(zip(handles["buffer_ids"].tolist(),
                                           handles["index"].tolist())):
        assert rb[member][slot]["x"].item() == float(i)


def test_a_member_written_past_its_capacity_returns_stale_generations_for_overwritten_records():
    rb = _ensemble(routing_key="m")
    rb.extend(_records([0.0, 1.0], [0, 0]))
    handles = rb.extend(_records(torch.arange(20.0, 26.0), [0] * 6))
    # TorchRL 0.14.1: index [2, 3, 0, 1, 2, 3], index_generation [0, 0, 1, 1, 1, 1]
    _assert_handles(handles, [0] * 6, [2, 3, 0, 1, 2, 3], [0, 0, 1, 1, 1, 1])
    assert _xs(rb)[0] == [22.0, 23.0, 24.0, 25.0]  # TorchRL 0.14.1
    assert rb[0].writer.generations_of(torch.arange(4)).tolist() == [1, 1, 1, 1]


def test_batched_data_is_flattened_and_nested_routing_keys_work():
    rb = _ensemble(routing_key=("meta", "agent"))
    assert rb.routing_key == ("meta", "agent") and rb.routing_dim is None
    data = TensorDict({"x": torch.arange(4.0).reshape(2, 2),
                       ("meta", "agent"): torch.tensor([[[0], [1]], [[1], [0]]])}, [2, 2])
    handles = rb.extend(data)  # ids of shape [2, 2, 1]: the trailing singleton is dropped
    _assert_handles(handles, [0, 1, 1, 0], [0, 0, 1, 1], [0, 0, 0, 0])
    assert _xs(rb) == [[0.0, 3.0], [1.0, 2.0]]


@pytest.mark.parametrize(("routing_dim", "shape", "ids", "index", "xs"), [
    # TorchRL 0.14.1, data x = arange(6) of the shape given
    (0, (2, 3), [0, 0, 0, 1, 1, 1], [0, 1, 2, 0, 1, 2], [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]),
    (1, (3, 2), [0, 1, 0, 1, 0, 1], [0, 0, 1, 1, 2, 2], [[0.0, 2.0, 4.0], [1.0, 3.0, 5.0]]),
    (-1, (3, 2), [0, 1, 0, 1, 0, 1], [0, 0, 1, 1, 2, 2], [[0.0, 2.0, 4.0], [1.0, 3.0, 5.0]]),
    (0, (2,), [0, 1], [0, 0], [[0.0], [1.0]]),
])
def test_routing_dim_writes_the_ith_entry_into_member_i(routing_dim, shape, ids, index, xs):
    rb = _ensemble(routing_dim=routing_dim)
    data = TensorDict({"x": torch.arange(6.0)[:torch.Size(shape).numel()].reshape(shape)}, shape)
    handles = rb.extend(data)
    _assert_handles(handles, ids, index, [0] * len(ids))
    assert _xs(rb) == xs


def test_add_routes_one_record_and_returns_scalar_handles():
    rb = _ensemble(routing_key="m")
    rb.extend(_records([0.0], [1]))
    handle = rb.add(TensorDict({"x": torch.tensor(9.0), "m": torch.tensor(1)}, []))
    # TorchRL 0.14.1: a TensorDict of batch size [] with 0-dim int64 entries
    assert handle.batch_size == torch.Size([]) and set(handle.keys()) == {
        "buffer_ids", "index", "index_generation"}
    assert all(v.dtype == torch.int64 and v.shape == () for v in handle.values())
    assert (int(handle["buffer_ids"]), int(handle["index"]), int(handle["index_generation"])) \
        == (1, 1, 0)
    assert _xs(rb) == [[], [0.0, 9.0]]


def test_handles_without_generations_when_a_member_writer_does_not_track_them():
    rb = ReplayBufferEnsemble(_member(), _member(track=False), routing_key="m")
    handles = rb.extend(_records([0.0, 1.0], [0, 1]))
    _assert_handles(handles, [0, 1], [0, 0])  # TorchRL 0.14.1: no index_generation
    assert not rb.writer.tracks_generations and rb.writer.info_keys == ()


def test_an_empty_batch_writes_nothing_and_returns_empty_handles():
    # (TorchRL 0.14.1 raises "shape '[1]' is invalid for input of size 0" from its tensordict)
    rb = _ensemble(routing_key="m")
    before = _snapshots(rb)
    handles = rb.extend(_records(torch.zeros(0), torch.zeros(0, dtype=torch.long)))
    _assert_handles(handles, [], [], [])
    assert_same(_snapshots(rb), before)


def test_each_member_applies_its_own_transform_and_priorities():
    prioritized = TensorDictReplayBuffer(storage=LazyTensorStorage(4),
                                         sampler=PrioritizedSampler(4, alpha=1.0, beta=1.0),
                                         priority_key="p")
    scaled = TensorDictReplayBuffer(storage=LazyTensorStorage(4))
    scaled.append_transform(lambda td: td.set("x", td["x"] * 10), invert=True)
    rb = ReplayBufferEnsemble(prioritized, scaled, routing_key="m")
    data = _records([1.0, 2.0, 3.0], [0, 1, 0]).set("p", torch.tensor([3.0, 5.0, 7.0]))
    rb.extend(data)
    assert _xs(rb) == [[1.0, 3.0], [20.0]]
    assert prioritized.sampler.state_dict()["priorities"][:2].tolist() == pytest.approx(
        [3.0, 7.0])  # (plus the sampler's eps)


def test_the_ensemble_transform_runs_before_routing():
    rb = _ensemble(routing_key="m")
    rb.append_transform(lambda td: td.set("m", 1 - td["m"]), invert=True)
    rb.extend(_records([0.0, 1.0, 2.0], [0, 0, 1]))
    assert _xs(rb) == [[2.0], [0.0, 1.0]]


def test_writes_go_to_members_in_ascending_order_under_the_ensemble_lock():
    rb = _ensemble(routing_key="m")
    order, blocked = [], []

    def member_0_writer_blocked():
        # while member 1 writes, another thread cannot write member 0: the ensemble holds
        # every member's lock until all the members are written
        writer = threading.Thread(target=lambda: rb[0].extend(_records([7.0], [0])))
        writer.start()
        writer.join(timeout=0.2)
        blocked.append(writer.is_alive())
        return writer

    threads = []
    for i, member in enumerate(rb.buffers):
        member.append_transform(lambda td, i=i: order.append(i) or td, invert=True)
    rb[1].append_transform(lambda td: threads.append(member_0_writer_blocked()) or td,
                           invert=True)
    rb.extend(_records([0.0, 1.0, 2.0], [1, 0, 1]))
    threads[0].join(timeout=5)
    # member 0, then member 1; the second 0 is the other thread's write-side transform, which
    # runs before that thread waits for member 0's lock
    assert order == [0, 0, 1] and blocked == [True]
    assert _xs(rb) == [[1.0, 7.0], [0.0, 2.0]]


def test_plain_replay_buffer_members_over_list_storages():
    rb = ReplayBufferEnsemble(_member(storage=ListStorage(4)), _member(storage=ListStorage(4)),
                              routing_key="m")
    handles = rb.extend(_records([5.0, 6.0], [0, 1]))
    _assert_handles(handles, [0, 1], [0, 0], [0, 0])  # TorchRL 0.14.1
    assert rb[1][0]["x"].item() == 6.0


# ---- refused writes: nothing changes ------------------------------------------------------------


@pytest.mark.parametrize(("call", "error", "match"), [
    # TorchRL 0.14.1 raises the same types, except where noted
    (lambda rb: rb.extend(_records([0.0, 1.0], [0, 2])), ValueError, r"outside \[0, 1\]"),
    (lambda rb: rb.extend(_records([0.0, 1.0], [-1, 0])), ValueError, r"ids \[-1\]"),
    (lambda rb: rb.extend(_records([0.0, 1.0], [0.0, 1.0])), TypeError, "integer member ids"),
    (lambda rb: rb.extend(_records([0.0, 1.0], [True, False])), TypeError, "integer"),
    # TorchRL: AttributeError ('NoneType' object has no attribute 'ndim')
    (lambda rb: rb.extend(TensorDict(x=torch.zeros(2), batch_size=[2])), KeyError,
     "routing_key 'm' is not an entry"),
    (lambda rb: rb.extend(_records([0.0, 1.0], [[0, 1], [0, 1]])), ValueError,
     "one member id per record"),
    (lambda rb: rb.extend({"x": torch.zeros(1), "m": torch.zeros(1)}), TypeError,
     "must be a TensorDict"),
    (lambda rb: rb.extend(_records([0.0], [0]), update_priority=False), NotImplementedError,
     "update_priority"),
    # TorchRL: AttributeError ('dict' object has no attribute 'ndim')
    (lambda rb: rb.add({"x": torch.tensor(0.0), "m": torch.tensor(0)}), TypeError,
     "must be a TensorDict"),
    (lambda rb: rb.add(_records([0.0], [0])), ValueError, "batch size \\[1\\]"),
    (lambda rb: rb.__setitem__(0, _records([0.0], [0])[0]), RuntimeError, "cannot be written"),
])
def test_bad_routed_writes_are_refused_before_any_member_changes(call, error, match):
    rb = _ensemble(routing_key="m")
    rb.extend(_records([0.0, 1.0, 2.0], [0, 1, 0]))
    before = _snapshots(rb)
    with pytest.raises(error, match=match):
        call(rb)
    assert_same(_snapshots(rb), before)


@pytest.mark.parametrize(("routing_dim", "data", "error", "match"), [
    # TorchRL 0.14.1: ValueError "routing_dim -1 has size 3, expected 2 ensemble members."
    (-1, TensorDict(x=torch.zeros(2, 3), batch_size=[2, 3]), ValueError, "has size 3"),
    # TorchRL 0.14.1: ValueError "routing_dim requires batched input."
    (0, TensorDict(x=torch.zeros(()), batch_size=[]), ValueError, "batched data"),
    # TorchRL 0.14.1 takes 5 % 2 == 1 and writes; tdreplay refuses, as torch would
    (5, TensorDict(x=torch.zeros(3, 2), batch_size=[3, 2]), ValueError, "out of range"),
])
def test_bad_routing_dim_writes_change_nothing(routing_dim, data, error, match):
    rb = _ensemble(routing_dim=routing_dim)
    before = _snapshots(rb)
    with pytest.raises(error, match=match):
        rb.extend(data)
    with pytest.raises(RuntimeError, match="use extend"):  # TorchRL 0.14.1: RuntimeError
        rb.add(TensorDict(x=torch.zeros(()), batch_size=[]))
    assert_same(_snapshots(rb), before)


def test_without_routing_writes_stay_refused():
    rb = _ensemble()
    before = _snapshots(rb)
    for call in (lambda: rb.extend(_records([0.0], [0])),
                 lambda: rb.add(_records([0.0], [0])[0])):
        # TorchRL 0.14.1: RuntimeError "ReplayBufferEnsemble writes are disabled. ..."
        with pytest.raises(RuntimeError, match="cannot be written to.*routing_key= or "
                                               "routing_dim="):
            call()
    assert_same(_snapshots(rb), before)


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    # TorchRL 0.14.1: ValueError, TypeError; RuntimeError for a key of 3 (from tensordict);
    # it accepts routing_dim=True
    ({"routing_key": "m", "routing_dim": 0}, ValueError, "mutually exclusive"),
    ({"routing_dim": "0"}, TypeError, "routing_dim must be an int"),
    ({"routing_dim": True}, TypeError, "routing_dim must be an int"),
    ({"routing_key": 3}, TypeError, "routing_key must be"),
    ({"routing_key": ("a", 3)}, TypeError, "routing_key must be"),
    ({"routing_key": ""}, TypeError, "routing_key must be"),
])
def test_bad_routing_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        _ensemble(**kwargs)


def test_routing_settings_are_checked_when_set():
    rb = _ensemble(routing_key=("m",))
    assert rb.routing_key == "m"  # unravelled, as TorchRL
    with pytest.raises(ValueError, match="mutually exclusive"):
        rb.routing_dim = 0
    rb.routing_key = None
    rb.routing_dim = 0
    assert (rb.routing_key, rb.routing_dim) == (None, 0)


def test_a_member_refusing_its_records_leaves_it_and_the_later_ones_unchanged():
    rb = _ensemble(4, 4, 4, routing_key="m")
    rb[1].extend(TensorDict(x=torch.zeros(1), m=torch.ones(1, dtype=torch.long),
                            batch_size=[1]))
    before = _snapshots(rb)
    wide = TensorDict(x=torch.zeros(3, 2), m=torch.tensor([0, 1, 2]), batch_size=[3])
    # TorchRL 0.14.1 writes member 0 too, then fails in member 1 after its writer moved on
    # (member 1 reports 2 records); tdreplay's member 1 is left as it was
    with pytest.raises(ValueError, match="'x'") as info:  # member 1 stores x of shape []
        rb.extend(wide)
    assert len(rb[0]) == 1 and rb[0][:]["x"].shape == (1, 2)  # written before member 1
    assert_same(_snapshots(rb)[1:], before[1:])
    if sys.version_info >= (3, 11):
        assert "member 1 refused its 1 records; members [0] were written" in str(
            info.value.__notes__)


def test_member_storages_must_be_one_dimensional():
    rb = ReplayBufferEnsemble(_member(), TensorDictReplayBuffer(
        storage=LazyTensorStorage(4, ndim=2)), routing_key="m")
    before = _snapshots(rb)
    # TorchRL 0.14.1 fails inside the member (ValueError "dim0 and dim1 must be within ...")
    with pytest.raises(ValueError, match="member 1 has a LazyTensorStorage with ndim=2"):
        rb.extend(_records([0.0, 1.0], [0, 1]))
    assert_same(_snapshots(rb), before)


# ---- samples carry generations ---------------------------------------------------------------


def test_samples_carry_index_generation_next_to_the_index():
    rb = _ensemble(routing_key="m", sample_from_all=True, batch_size=4)
    rb.extend(_records(torch.arange(6.0), [0, 1, 0, 1, 0, 1]))
    rb.extend(_records([9.0, 9.0], [0, 0]))  # member 0 wraps: slot 0 at generation 1
    sample = rb.sample()
    # TorchRL 0.14.1: "index_generation" int64 of the sample's shape [2, 2], beside "index"
    generation = sample["index_generation"]
    assert generation.dtype == torch.int64 and generation.shape == (2, 2)
    for part in range(2):
        slots = sample["index", "index"][part]
        expected = rb[part].writer.generations_of(slots)
        assert generation[part].tolist() == expected.tolist()
    assert rb.writer.generations_of(sample["index"]).tolist() == generation.tolist()
    _, info = rb.sample(return_info=True)
    assert info["index_generation"].shape == (2, 2)


def test_samples_carry_no_generation_when_a_writer_does_not_track_them():
    rb = ReplayBufferEnsemble(_member(), _member(track=False), sample_from_all=True)
    rb[0].extend(_records([0.0], [0]))
    rb[1].extend(_records([0.0], [1]))
    assert "index_generation" not in rb.sample(2).keys()  # TorchRL 0.14.1


def test_writer_ensemble_generations_of_parts_that_do_not_stack():
    writers = WriterEnsemble(*(RoundRobinWriter(track_generations=True) for _ in range(2)))
    for w in writers.writers:
        w.register_storage(ListStorage(2))
        w.extend([0, 1, 2])
    parts = [TensorDict(buffer_ids=torch.tensor([0]), index=torch.tensor([0])),
             TensorDict(buffer_ids=torch.tensor([1, 1]), index=torch.tensor([1, 0]))]
    info = writers.sample_info(parts)
    assert [g.tolist() for g in info["index_generation"]] == [[1], [0, 1]]
    with pytest.raises(TypeError, match="TensorDict of ensemble handles"):
        writers.generations_of(torch.tensor([0]))


# ---- update_if_present ---------------------------------------------------------------------------


def _updatable():
    rb = _ensemble(routing_key="m", sample_from_all=True, batch_size=4)
    rb.extend(_records(torch.arange(6.0), [0, 1, 0, 1, 0, 1]))
    handles = rb.extend(_records([10.0, 11.0, 12.0], [1, 1, 1]))
    # TorchRL 0.14.1: buffer_ids [1, 1, 1], index [3, 0, 1], index_generation [0, 1, 1]
    _assert_handles(handles, [1, 1, 1], [3, 0, 1], [0, 1, 1])
    return rb, handles


def test_update_if_present_patches_each_handle_in_its_member():
    rb, handles = _updatable()
    result = rb.update_if_present(index=handles, generation=handles["index_generation"],
                                  patch={"x": torch.tensor([-1.0, -2.0, -3.0])})
    assert isinstance(result, ConditionalUpdateResult)
    assert result.updated.dtype == torch.bool and result.updated.tolist() == [True] * 3
    assert result.version_rejected is None
    assert _xs(rb) == [[0.0, 2.0, 4.0], [-2.0, -3.0, 5.0, -1.0]]  # TorchRL 0.14.1
    counts = [m.write_count for m in rb.buffers]
    stale = TensorDict(buffer_ids=torch.tensor([0, 1, 1]), index=torch.tensor([0, 0, 2]),
                       batch_size=[3])
    result = rb.update_if_present(index=stale, generation=torch.zeros(3, dtype=torch.long),
                                  patch=TensorDict(x=torch.tensor([-7.0, -8.0, -9.0]),
                                                   batch_size=[3]))
    assert result.updated.tolist() == [True, False, True]  # TorchRL 0.14.1
    assert (result.updated_count, result.stale_count) == (2, 1)
    assert _xs(rb) == [[-7.0, 2.0, 4.0], [-2.0, -3.0, -9.0, -1.0]]  # TorchRL 0.14.1
    assert [m.write_count for m in rb.buffers] == counts  # patches are not writes
    assert rb[1].writer.generations_of(torch.arange(4)).tolist() == [1, 1, 0, 0]


def test_update_if_present_with_versions():
    rb, handles = _updatable()
    result = rb.update_if_present(index=handles, generation=handles["index_generation"],
                                  patch={"x": torch.tensor([5.0, 6.0, 7.0])}, version_key="m",
                                  version=torch.tensor([1, 0, 2]))
    # TorchRL 0.14.1: updated [True, False, True], version_rejected [False, True, False]
    assert result.updated.tolist() == [True, False, True]
    assert result.version_rejected.tolist() == [False, True, False]
    assert _xs(rb)[1] == [11.0, 7.0, 5.0, 5.0]  # slot 0 (11.0) lost the comparison
    assert rb[1][:]["m"].tolist() == [1, 2, 1, 1]  # TorchRL 0.14.1


def test_update_if_present_from_a_sample_has_the_sample_shape():
    rb, _ = _updatable()
    sample = rb.sample()
    rb.extend(_records([20.0], [1]))  # member 1's slot 2 is rewritten
    result = rb.update_if_present(index=sample["index"], generation=sample["index_generation"],
                                  patch={"x": torch.full((2, 2), 50.0)})
    assert result.updated.shape == (2, 2)
    slots = sample["index", "index"]
    expected = [[True, True], [int(s) != 2 for s in slots[1]]]
    assert result.updated.tolist() == expected
    for part in range(2):
        for slot, live in zip(slots[part].tolist(), expected[part]):
            assert rb[part][slot]["x"].item() == (50.0 if live else 20.0)


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    # TorchRL 0.14.1 raises the same types
    ({"index": TensorDict(buffer_ids=torch.tensor([0, 2, 1]), index=torch.zeros(3, dtype=int),
                          batch_size=[3])}, ValueError, r"ids \[2\]"),
    ({"index": torch.tensor([0, 1, 2])}, TypeError, "TensorDict of ensemble handles"),
    ({"generation": torch.zeros(2, dtype=torch.long)}, ValueError, "one generation per handle"),
    ({"patch": {"x": torch.zeros(2)}}, ValueError, r"patch\['x'\] has shape \(2,\)"),
    ({"patch": {"y": torch.zeros(3)}}, KeyError, "'y'"),
    ({"patch": {"x": torch.zeros(3, dtype=torch.int64)}}, ValueError, "dtype"),
    ({"patch": TensorDict(x=torch.zeros(3))}, ValueError, "batch size"),
    ({"version_key": "m"}, ValueError, "together"),
    ({"version_key": "m", "version": torch.tensor([1.0, 2.0, 3.0])}, ValueError, "dtype"),
])
def test_bad_updates_patch_no_member(kwargs, error, match):
    rb, handles = _updatable()
    before = _snapshots(rb)
    arguments = {"index": handles, "generation": handles["index_generation"],
                 "patch": {"x": torch.ones(3)}, **kwargs}
    with pytest.raises(error, match=match):
        rb.update_if_present(**arguments)
    with pytest.raises(error, match=match):
        rb.submit_update_if_present(**arguments)
    assert_same(_snapshots(rb), before)


def test_a_part_refused_by_a_later_member_patches_no_member():
    rb = _ensemble(routing_key="m")
    rb[0].extend(_records([0.0], [0]))
    rb[1].extend(TensorDict(x=torch.zeros(1, 2), m=torch.ones(1, dtype=torch.long),
                            batch_size=[1]))  # member 1 stores x of shape [2]
    handles = TensorDict(buffer_ids=torch.tensor([0, 1]), index=torch.tensor([0, 0]),
                         batch_size=[2])
    before = _snapshots(rb)
    # TorchRL 0.14.1 patches member 0 (x becomes 1.0), then member 1 raises ValueError
    with pytest.raises(ValueError, match=r"patch\['x'\]"):
        rb.update_if_present(index=handles, generation=torch.zeros(2, dtype=torch.long),
                             patch={"x": torch.ones(2)})  # fits member 0, not member 1
    assert_same(_snapshots(rb), before)


def test_conditional_updates_need_every_member_to_support_them():
    for rb in (ReplayBufferEnsemble(_member(), _member(track=False), routing_key="m"),
               ReplayBufferEnsemble(_member(storage=ListStorage(4)), _member(),
                                    routing_key="m")):
        handles = rb.extend(_records([0.0, 1.0], [0, 1]))
        before = _snapshots(rb)
        # TorchRL 0.14.1: RuntimeError "Conditional updates require every ensemble member ..."
        with pytest.raises(RuntimeError, match=r"members (1|0) \("):
            rb.update_if_present(index=handles, generation=torch.zeros(2, dtype=torch.long),
                                 patch={"x": torch.ones(2)})
        assert_same(_snapshots(rb), before)


def test_submit_update_if_present_runs_in_order_and_samples_wait_for_it():
    rb, handles = _updatable()
    futures = [rb.submit_update_if_present(index=handles, generation=handles["index_generation"],
                                           patch={"x": torch.full((3,), value)})
               for value in (1.0, 2.0)]
    sample = rb.sample()  # waits for the submitted updates
    assert [f.result().updated.tolist() for f in futures] == [[True] * 3] * 2
    assert _xs(rb)[1] == [2.0, 2.0, 5.0, 2.0]
    assert set(sample[1]["x"].tolist()) <= {2.0, 5.0}
    rb.synchronize()
    rb.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        rb.submit_update_if_present(index=handles, generation=handles["index_generation"],
                                    patch={"x": torch.ones(3)})


# ---- state --------------------------------------------------------------------------------------


def test_state_dict_pickle_and_checkpoints_keep_working(tmp_path):
    rb = _ensemble(routing_key="m")
    rb.extend(_records(torch.arange(5.0), [0, 1, 0, 1, 0]))
    state = rb.state_dict()
    assert "routing" not in str(list(state))  # configuration, not state (as TorchRL)
    rb.dumps(tmp_path / "ckpt")
    fresh = _ensemble(routing_key="m")
    fresh.load_state_dict(state)
    loaded = _ensemble(routing_key="m")
    loaded.loads(tmp_path / "ckpt")
    copied = pickle.loads(pickle.dumps(rb))
    assert copied.routing_key == "m"
    expected = rb.extend(_records([7.0, 8.0], [1, 0]))
    for other in (fresh, loaded, copied):
        assert_same(other.extend(_records([7.0, 8.0], [1, 0])), expected)
        assert _xs(other) == _xs(rb)
