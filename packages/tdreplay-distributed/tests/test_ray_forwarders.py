"""RayReplayBuffer's forwarders of TorchRL's ``read_all_in_order``, ``write_all``, ``set_``,
``set_at_``, ``update_``, ``query``, ``submit_update_if_present``, ``share`` and ``as_remote``,
against a local Ray actor."""

from __future__ import annotations

import concurrent.futures
from functools import partial

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ListStorage, ReplayBuffer, TensorDictReplayBuffer
from tdreplay.core.query import Trajectory, traj
from tdreplay.distributed import BufferActorDiedError, RayReplayBuffer, RemoteCallTimeoutError
from tdreplay.distributed._wire import pack
from tdreplay.distributed.conditional_updates import RemoteUpdateFuture
from tdreplay.storages import LazyTensorStorage
from tdreplay.writers import TensorDictRoundRobinWriter

NAME = "forwarders-td"


@pytest.fixture(scope="module")
def _td_buffer(ray_session):
    rb = RayReplayBuffer(storage=partial(LazyTensorStorage, 6),
                         writer=partial(TensorDictRoundRobinWriter, track_generations=True),
                         replay_buffer_cls=TensorDictReplayBuffer, batch_size=4, name=NAME)
    yield rb
    rb.shutdown()


@pytest.fixture
def td_rb(_td_buffer):
    """A named TensorDict buffer actor of 6 rows (generations tracked, batch 4), emptied."""
    _td_buffer.empty()
    return _td_buffer


@pytest.fixture(scope="module")
def list_rb(ray_session):
    rb = RayReplayBuffer(storage=partial(ListStorage, 5))
    yield rb
    rb.shutdown()


def _rows(n: int, start: int = 0) -> TensorDict:
    x = torch.arange(start, start + n, dtype=torch.float32)
    return TensorDict({"x": x, "y": torch.stack([x, -x], -1),
                       "version": torch.zeros(n, dtype=torch.long)}, [n])


def _stored(rb) -> tuple[list[float], list[list[float]]]:
    data = rb[:]
    return data["x"].tolist(), data["y"].tolist()


# ---- read_all_in_order / write_all -----------------------------------------------------------
def test_read_all_in_order_gives_the_rows_in_storage_order(td_rb) -> None:
    td_rb.extend(_rows(8))  # 6 rows: slots 0 and 1 rewritten by rows 6 and 7
    data = td_rb.read_all_in_order()
    assert data["x"].tolist() == [6.0, 7.0, 2.0, 3.0, 4.0, 5.0]
    assert data["y"][:, 1].tolist() == [-6.0, -7.0, -2.0, -3.0, -4.0, -5.0]
    assert td_rb.read_all_in_order(2)["x"].tolist() == [6.0, 7.0]
    assert td_rb.read_all_in_order(torch.tensor(3))["x"].tolist() == [6.0, 7.0, 2.0]
    # a copy the caller owns: changing it changes nothing remotely
    data["x"].zero_()
    assert _stored(td_rb)[0] == [6.0, 7.0, 2.0, 3.0, 4.0, 5.0]


def test_write_all_writes_the_leading_slots(td_rb) -> None:
    td_rb.extend(_rows(4))
    data = td_rb.read_all_in_order()
    data["x"].mul_(10)  # edit the copy in place, write it back
    assert td_rb.write_all(data) is None
    assert _stored(td_rb)[0] == [0.0, 10.0, 20.0, 30.0]
    td_rb.write_all(_rows(3, start=100)[:2], end=2)
    x, y = _stored(td_rb)
    assert x == [100.0, 101.0, 20.0, 30.0] and y[1] == [101.0, -101.0]
    assert len(td_rb) == 4 and td_rb.write_count == 4  # an edit, not a write of new rows


def test_list_storage_reads_and_writes_back_items(list_rb) -> None:
    list_rb.empty()
    list_rb.extend([torch.tensor(1), torch.tensor(2), torch.tensor(3)])
    assert list_rb.read_all_in_order().tolist() == [1, 2, 3]
    list_rb.write_all([torch.tensor(7), torch.tensor(8)])
    assert list_rb.read_all_in_order().tolist() == [7, 8, 3]
    with pytest.raises(TypeError, match="set_/set_at_ need a TensorStorage"):
        list_rb.set_("x", torch.zeros(3))
    with pytest.raises(TypeError, match="query needs a tensordict-backed storage"):
        list_rb.query()
    assert list_rb.read_all_in_order().tolist() == [7, 8, 3]


def test_bad_reads_and_writes_raise_and_change_nothing(td_rb) -> None:
    td_rb.extend(_rows(4))
    before = _stored(td_rb)
    with pytest.raises(TypeError, match="read_all_in_order: end must be an int"):
        td_rb.read_all_in_order("2")
    with pytest.raises(TypeError, match="write_all: end must be an int"):
        td_rb.write_all(_rows(2), end=True)
    with pytest.raises(ValueError, match="batch size \\[2\\], but the index covers 3 slots"):
        td_rb.write_all(_rows(2), end=3)  # 2 rows for 3 slots
    with pytest.raises(KeyError, match="data keys do not match the storage"):
        td_rb.write_all(TensorDict({"z": torch.ones(2)}, [2]))
    assert _stored(td_rb) == before and len(td_rb) == 4


# ---- set_ / set_at_ / update_ ----------------------------------------------------------------
def test_set_and_set_at_edit_entries_in_place(td_rb) -> None:
    td_rb.extend(_rows(4))
    assert td_rb.set_("x", torch.tensor([5.0, 6.0, 7.0, 8.0])) is td_rb
    x, y = _stored(td_rb)
    assert x == [5.0, 6.0, 7.0, 8.0] and y[3] == [3.0, -3.0]  # only "x" changed
    assert td_rb.set_at_("y", torch.tensor([[1.0, 1.0], [2.0, 2.0]]), torch.tensor([3, 0])) \
        is td_rb
    x, y = _stored(td_rb)
    assert y == [[2.0, 2.0], [1.0, -1.0], [2.0, -2.0], [1.0, 1.0]] and x == [5.0, 6.0, 7.0, 8.0]


def test_bad_set_and_set_at_raise_and_change_nothing(td_rb) -> None:
    td_rb.extend(_rows(4))
    before = _stored(td_rb)
    with pytest.raises(KeyError, match="key 'z' is not in the storage"):
        td_rb.set_("z", torch.zeros(4))
    with pytest.raises(ValueError, match="value of shape \\(3,\\) for key 'x'"):
        td_rb.set_("x", torch.zeros(3))
    with pytest.raises(ValueError, match="index .* is not within the 4 written rows"):
        td_rb.set_at_("x", torch.zeros(2), torch.tensor([1, 5]))
    assert _stored(td_rb) == before


def test_update_writes_the_given_entries(td_rb) -> None:
    td_rb.extend(_rows(3))
    assert td_rb.update_({"x": torch.tensor([9.0, 8.0, 7.0])}) is td_rb
    assert _stored(td_rb) == ([9.0, 8.0, 7.0], [[0.0, -0.0], [1.0, -1.0], [2.0, -2.0]])
    patch = TensorDict({"x": torch.zeros(3), "y": torch.ones(3, 2)}, [3])
    td_rb.update_(patch, clone=True, keys_to_update=["y"])
    assert _stored(td_rb) == ([9.0, 8.0, 7.0], [[1.0, 1.0]] * 3)


def test_bad_update_raises_and_changes_nothing(td_rb) -> None:
    td_rb.extend(_rows(3))
    before = _stored(td_rb)
    with pytest.raises(TypeError, match="update_: input_dict_or_td must be a dict or a "
                                        "TensorDict, got Tensor"):
        td_rb.update_(torch.zeros(3))
    with pytest.raises(RuntimeError, match="batch dimension mismatch"):
        td_rb.update_({"x": torch.zeros(2)})
    with pytest.raises(ValueError, match="for key 'y' does not fit"):
        td_rb.update_(TensorDict({"y": torch.ones(2, 2)}, [2]), keys_to_update=["y"])
    assert _stored(td_rb) == before


def test_edits_drop_the_batches_a_client_drew_ahead(td_rb) -> None:
    td_rb.extend(_rows(4))
    reader = RayReplayBuffer.attach(NAME, prefetch=2)
    assert reader.sample()["x"].min() >= 0  # two more batches are now drawn ahead
    reader.set_("x", torch.full((4,), -1.0))
    assert reader.sample()["x"].tolist() == [-1.0] * 4  # drawn after the edit
    reader.sample()
    reader.update_({"x": torch.full((4,), -2.0)})
    assert reader.sample()["x"].tolist() == [-2.0] * 4
    reader.sample()
    reader.write_all(_rows(4, start=50))
    assert reader.sample()["x"].min() >= 50


def test_clear_prefetch_drops_what_was_drawn_before_another_client_emptied(td_rb) -> None:
    # (another client's empty does not reach this one: 2 batches of rows gone since came)
    td_rb.extend(_rows(4))
    reader = RayReplayBuffer.attach(NAME, prefetch=2)
    assert reader.sample()["x"].max() < 4  # two more batches are now drawn ahead
    td_rb.empty()
    td_rb.extend(_rows(4, start=50))
    reader.clear_prefetch()
    for _ in range(3):
        assert reader.sample()["x"].min() >= 50  # drawn after the refill


def test_a_client_handle_has_the_forwarders(td_rb) -> None:
    td_rb.extend(_rows(2))
    handle = td_rb.client()
    # what returns the buffer returns the handle: the buffer's close/shutdown stay out of reach
    assert handle.set_at_("x", torch.tensor([4.0]), torch.tensor([1])) is handle
    assert handle.share() is handle and handle.shared is True
    assert handle.read_all_in_order()["x"].tolist() == [0.0, 4.0]
    assert not hasattr(handle.update_({"x": torch.ones(2)}), "close")
    assert _stored(td_rb)[0] == [1.0, 1.0]


# ---- query -------------------------------------------------------------------------------
def _episodes() -> TensorDict:
    return TensorDict({"episode": torch.tensor([0, 0, 0, 1, 1]),
                       "obs": torch.arange(5.0),
                       "next": {"reward": torch.tensor([[1.0], [2.0], [3.0], [10.0], [0.0]])}},
                      [5])


def test_query_returns_the_matching_trajectories_as_values(ray_session) -> None:
    rb = RayReplayBuffer(storage=partial(LazyTensorStorage, 10),
                         replay_buffer_cls=TensorDictReplayBuffer)
    try:
        assert rb.query() == []  # empty buffer
        rb.extend(_episodes())
        everything = rb.query()
        assert [type(t) for t in everything] == [Trajectory, Trajectory]
        assert [t.obs.tolist() for t in everything] == [[0.0, 1.0, 2.0], [3.0, 4.0]]
        assert [t.length for t in rb.query(traj.length < 3)] == [2]
        rich = rb.query(traj.reward.sum() > 6)  # a traj expression, run in the actor
        assert [t.total_reward.item() for t in rich] == [10.0]
        assert [t.obs.tolist() for t in rb.query(lambda t: bool(t.obs[0] == 0))] == \
            [[0.0, 1.0, 2.0]]
        assert [t.length for t in rb.query(trajectory_key="episode")] == [3, 2]
        everything[0].obs.zero_()  # a copy: the stored steps are as they were
        assert rb[:]["obs"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
        # bad queries raise their own errors
        with pytest.raises(TypeError, match="predicate must be callable"):
            rb.query(3)
        with pytest.raises(TypeError, match="ambiguous"):
            rb.query(traj.obs > 0)
        with pytest.raises(KeyError, match="trajectory_key .*nope.* is not in the data"):
            rb.query(trajectory_key="nope")
        with pytest.raises(ZeroDivisionError):
            rb.query(lambda t: 1 / 0 > 0)  # the predicate's own error, from the actor
    finally:
        rb.close()


# ---- submit_update_if_present ------------------------------------------------------------
def _generations(rb, index: torch.Tensor) -> torch.Tensor:
    """The write generations of the stored rows at ``index``, as samples report them."""
    known = {}
    for _ in range(8):  # 8 x 64 draws over a few rows: every row is drawn
        sample = rb.sample(64)
        known.update(zip(sample["index"].tolist(), sample["index_generation"].tolist()))
    return torch.tensor([known[i] for i in index.tolist()])


def test_submit_update_if_present_returns_a_future_of_the_result(td_rb) -> None:
    index = td_rb.extend(_rows(4))
    generation = _generations(td_rb, index)
    td_rb.extend(_rows(1, start=40))  # row 4: not in the patch
    future = td_rb.submit_update_if_present(index=index, generation=generation,
                                            patch={"x": torch.tensor([5.0, 6.0, 7.0, 8.0])})
    assert isinstance(future, concurrent.futures.Future)
    assert not future.cancel()  # queued in the actor already
    result = future.result()
    assert result.updated.tolist() == [True] * 4 and result.stale_count == 0
    assert future.done() and future.exception() is None
    assert _stored(td_rb)[0] == [5.0, 6.0, 7.0, 8.0, 40.0]
    # a record rewritten since the handle was taken is skipped
    td_rb.extend(_rows(2, start=60))  # rows 5 and then 0 (wrapped) rewritten
    stale = td_rb.submit_update_if_present(index=index[:2], generation=generation[:2],
                                           patch={"x": torch.tensor([-1.0, -2.0])})
    assert stale.result().updated.tolist() == [False, True]
    td_rb.synchronize()
    assert _stored(td_rb)[0] == [61.0, -2.0, 7.0, 8.0, 40.0, 60.0]


def test_submit_update_if_present_with_versions(td_rb) -> None:
    index = td_rb.extend(_rows(3).zero_())
    generation = _generations(td_rb, index)
    future = td_rb.submit_update_if_present(
        index=index, generation=generation, patch={"x": torch.ones(3)},
        version_key="version", version=torch.tensor([1, 0, 2]), require_newer=True)
    result = future.result()
    assert result.updated.tolist() == [True, False, True]
    assert result.version_rejected.tolist() == [False, True, False]
    assert td_rb[:]["x"].tolist() == [1.0, 0.0, 1.0]
    assert td_rb[:]["version"].tolist() == [1, 0, 2]


def test_a_bad_submitted_update_raises_at_submission(td_rb) -> None:
    index = td_rb.extend(_rows(3))
    generation = _generations(td_rb, index)
    before = _stored(td_rb)
    with pytest.raises(KeyError, match="patch key 'nope' is not an entry"):
        td_rb.submit_update_if_present(index=index, generation=generation,
                                       patch={"nope": torch.zeros(3)})
    with pytest.raises(ValueError):
        td_rb.submit_update_if_present(index=index, generation=generation[:2],
                                       patch={"x": torch.zeros(3)})
    td_rb.synchronize()  # nothing was queued
    assert _stored(td_rb) == before


def test_a_remote_update_future_waits_call_timeout_and_translates_errors(ray_session) -> None:
    pending: RemoteUpdateFuture = RemoteUpdateFuture(0.05, "submit_update_if_present", "'b'")
    with pytest.raises(RemoteCallTimeoutError, match="no answer within 0.05 s"):
        pending.result()
    with pytest.raises(RemoteCallTimeoutError, match="no answer within 0.01 s"):
        pending.exception(timeout=0.01)
    answered: concurrent.futures.Future = concurrent.futures.Future()
    pending.settle_with(answered)
    answered.set_result(pack(torch.arange(3)))
    assert pending.result().tolist() == [0, 1, 2]

    died: RemoteUpdateFuture = RemoteUpdateFuture(None, "submit_update_if_present", "'b'")
    failed: concurrent.futures.Future = concurrent.futures.Future()
    died.settle_with(failed)
    failed.set_exception(ray_session.exceptions.RayActorError())
    with pytest.raises(BufferActorDiedError, match="submit_update_if_present failed: buffer "
                                                   "actor 'b' is dead"):
        died.result()

    own: RemoteUpdateFuture = RemoteUpdateFuture(None, "submit_update_if_present", "'b'")
    raised: concurrent.futures.Future = concurrent.futures.Future()
    own.settle_with(raised)
    raised.set_exception(TimeoutError("the update's own"))
    with pytest.raises(TimeoutError, match="the update's own"):
        own.result(timeout=0.01)


# ---- share / as_remote -------------------------------------------------------------------
def test_share_returns_the_buffer_already_shared(td_rb) -> None:
    td_rb.extend(_rows(2))
    assert td_rb.shared is True
    assert td_rb.share() is td_rb and td_rb.share(True) is td_rb
    with pytest.raises(ValueError, match="share\\(shared=False\\): a RayReplayBuffer is shared"):
        td_rb.share(False)
    assert td_rb.shared is True and len(td_rb) == 2


def test_as_remote_serves_the_class_in_an_actor(ray_session) -> None:
    with pytest.raises(TypeError, match="as_remote: remote_config must be a dict"):
        RayReplayBuffer.as_remote(["num_cpus", 0])
    remote_cls = RayReplayBuffer.as_remote({"num_cpus": 0})
    assert remote_cls.is_remote is True
    actor = remote_cls.remote(storage=partial(ListStorage, 10), batch_size=2)
    try:
        assert ray_session.get(actor.extend.remote([1, 2, 3])).tolist() == [0, 1, 2]
        assert list(ray_session.get(actor.read_all_in_order.remote())) == [1, 2, 3]
        assert len(ray_session.get(actor.sample.remote(5))) == 5
        ray_session.get(actor.close.remote())
    finally:
        ray_session.kill(actor)
    assert ReplayBuffer.as_remote({"num_cpus": 0}) is not None  # core's, untouched
