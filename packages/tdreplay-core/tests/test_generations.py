"""Write generations (RoundRobinWriter(track_generations=True)) on core's own parts."""

from __future__ import annotations

import pytest
import torch

from tdreplay.core import ListStorage, ReplayBuffer, RoundRobinWriter
from tdreplay.core.generations import SlotGenerations


def _items(values):
    return [torch.tensor(v) for v in values]


def _rb(size=4, track=True, storage=None):
    return ReplayBuffer(storage=storage if storage is not None else ListStorage(size),
                        writer=RoundRobinWriter(track_generations=track))


def test_opt_in_and_default_reports_minus_one():
    rb = ReplayBuffer(storage=ListStorage(4))
    index = rb.extend(_items(range(4)))
    assert rb.writer.tracks_generations is False
    assert rb.writer.generations_of(index).tolist() == [-1] * 4
    assert rb.storage.slot_generations is None
    _, info = rb.sample(2, return_info=True)
    assert "index_generation" not in info


def test_stamps_advance_per_write_and_wrap():
    rb = _rb(4)
    rb.extend(_items(range(10)))  # rows 0, 1 written three times, rows 2, 3 twice
    assert rb.writer.generations_of(torch.arange(4)).tolist() == [2, 2, 1, 1]
    rb.add(torch.tensor(10))
    assert rb.writer.generations_of(torch.arange(4)).tolist() == [2, 2, 2, 1]


def test_unwritten_and_out_of_range_are_minus_one():
    rb = _rb(4)
    rb.extend(_items(range(2)))
    assert rb.writer.generations_of(torch.tensor([0, 1, 2, 3, -1, 9])).tolist() == \
        [0, 0, -1, -1, -1, -1]
    assert rb.writer.generations_of((torch.tensor(1), torch.tensor(0))).tolist() == 0


def test_sample_carries_index_generation():
    rb = _rb(8)
    rb.extend(_items(range(8)))
    _, info = rb.sample(5, return_info=True)
    assert torch.equal(info["index_generation"], rb.writer.generations_of(info["index"]))


def test_stamps_live_on_the_storage_and_empty_invalidates():
    storage = ListStorage(4)
    tracking, plain = _rb(storage=storage), ReplayBuffer(storage=storage)
    index = tracking.extend(_items(range(4)))
    before = tracking.writer.generations_of(index)
    plain.extend(_items([9, 9]))  # a non-tracking writer still advances a shared table
    assert (tracking.writer.generations_of(index) != before).tolist() == [True, True, False,
                                                                          False]
    plain.empty()
    after = tracking.writer.generations_of(index)
    assert (after > before).all()
    assert tracking.writer.generations_of(index).min() >= 1


def test_empty_keeps_the_unwritten_sentinel():
    rb = _rb(4)
    rb.extend(_items(range(2)))
    rb.empty()
    assert rb.writer.generations_of(torch.arange(4)).tolist() == [1, 1, -1, -1]


def test_write_at_advances_without_moving_the_cursor():
    rb = _rb(4)
    rb.extend(_items(range(4)))
    cursor = rb.writer.cursor
    assert rb.writer.write_at(torch.tensor([0, 2]), _items([7, 8])).tolist() == [0, 2]
    assert rb.writer.cursor == cursor and rb.write_count == 6
    assert rb.writer.generations_of(torch.arange(4)).tolist() == [1, 0, 1, 0]
    assert rb[0].item() == 7
    with pytest.raises(IndexError, match="index"):
        rb.writer.write_at(torch.tensor([4]), _items([1]))
    with pytest.raises(ValueError, match="index addresses 2 rows"):
        rb.writer.write_at(torch.tensor([0, 1]), _items([1]))


def test_state_dict_round_trip_and_dumps(tmp_path):
    rb = _rb(4)
    rb.extend(_items(range(5)))
    state = rb.state_dict()
    assert state["_writer"]["generation"].tolist()[:4] == [1, 0, 0, 0]
    rb2 = _rb(4)
    rb2.load_state_dict(state)
    assert rb2.writer.generations_of(torch.arange(4)).tolist() == [1, 0, 0, 0]
    rb.dumps(tmp_path / "ckpt")
    rb3 = _rb(4)
    rb3.loads(tmp_path / "ckpt")
    assert rb3.writer.generations_of(torch.arange(4)).tolist() == [1, 0, 0, 0]


def test_writer_state_before_register_storage():
    writer = RoundRobinWriter(track_generations=True)
    writer.load_state_dict({"cursor": 1, "write_count": 5,
                            "generation": torch.tensor([1, 0, 0, 0])})
    rb = ReplayBuffer(storage=ListStorage(4), writer=writer)
    assert rb.writer.generations_of(torch.arange(4)).tolist() == [1, 0, 0, 0]


@pytest.mark.parametrize("bad, match", [
    (torch.tensor([0.5, 1.0]), "int64"),
    (torch.tensor([[0, 1]]), "1-D"),
    (torch.tensor([0, -3]), ">= -1"),
    (torch.zeros(9, dtype=torch.int64), "holds 4"),
])
def test_bad_generation_state_refused_unchanged(bad, match):
    rb = _rb(4)
    rb.extend(_items(range(4)))
    before = rb.writer.generations_of(torch.arange(4)).clone()
    state = rb.writer.state_dict()
    state["generation"] = bad
    with pytest.raises(ValueError, match=match):
        rb.writer.load_state_dict(state)
    assert torch.equal(rb.writer.generations_of(torch.arange(4)), before)
    assert rb.writer.cursor == 0


@pytest.mark.parametrize("table", [torch.tensor([0, 0, 0]), torch.tensor([0, 0, -1, 0])],
                         ids=["shorter-than-the-rows", "a-written-row-unstamped"])
def test_a_buffer_state_whose_table_misses_written_rows_is_refused(table):
    # a written row without a stamp would never match its handles: updates of it skipped
    rb = _rb(4)
    rb.extend(_items(range(4)))
    before = rb.writer.generations_of(torch.arange(4)).clone()
    state = rb.state_dict()
    state["_writer"]["generation"] = table
    with pytest.raises(ValueError, match="does not stamp every written row"):
        rb.load_state_dict(state)
    assert torch.equal(rb.writer.generations_of(torch.arange(4)), before)
    state["_writer"]["generation"] = torch.tensor([0, 0, 0, 0, 0])[:4]
    rb.load_state_dict(state)  # a full table loads


def test_track_generations_must_be_bool():
    with pytest.raises(TypeError, match="track_generations"):
        RoundRobinWriter(track_generations=1)


def test_slot_generations_table():
    gens = SlotGenerations()
    gens.bump(torch.tensor([3]), capacity=5)
    assert gens.table.tolist() == [-1, -1, -1, 0, -1]
    assert gens.of(torch.tensor([[3, 0]])).tolist() == [[0, -1]]


def test_update_if_present_needs_the_capability():
    rb = _rb(4)
    index = rb.extend(_items(range(4)))
    with pytest.raises(RuntimeError, match="conditional"):
        rb.update_if_present(index=index, generation=rb.writer.generations_of(index),
                             patch={"obs": torch.zeros(4)})


@pytest.mark.parametrize("how", ["state_dict", "dumps"])
def test_a_restore_moves_the_stamps_past_the_handles_given_out(how, tmp_path):
    saved = _rb(4)
    saved.extend(_items(range(4)))  # stamps 0 0 0 0
    live = _rb(4)
    live.extend(_items(range(10, 16)))  # stamps 1 1 0 0
    handles = live.writer.generations_of(torch.arange(4))
    if how == "state_dict":
        live.load_state_dict(saved.state_dict())
    else:
        saved.dumps(tmp_path)
        live.loads(tmp_path)
    after = live.writer.generations_of(torch.arange(4))
    assert after.tolist() == [2, 2, 1, 1]  # past each row's stamp the live buffer gave out
    assert not (after == handles).any()  # a handle taken before matches no restored row
    assert [int(x) for x in live[:]] == [0, 1, 2, 3]
    fresh = _rb(4)  # nothing given out: the saved stamps as they are
    fresh.load_state_dict(saved.state_dict())
    assert fresh.writer.generations_of(torch.arange(4)).tolist() == [0, 0, 0, 0]


def test_stamps_grow_by_one_a_restore_of_a_buffer_rolling_back():
    rb = _rb(4)
    rb.extend(_items(range(4)))
    for _ in range(100):
        rb.load_state_dict(rb.state_dict())
    stamps = rb.writer.generations_of(torch.arange(4))
    assert stamps.tolist() == [100, 100, 100, 100]
    handle = rb.writer.generations_of(torch.arange(4))
    rb.load_state_dict(rb.state_dict())
    assert not (rb.writer.generations_of(torch.arange(4)) == handle).any()


def test_a_state_saved_untracked_makes_the_handles_stale():
    saved = _rb(4, track=False)
    saved.extend(_items(range(4)))
    live = _rb(4)
    index = live.extend(_items(range(100, 104)))
    handles = live.writer.generations_of(index)
    live.load_state_dict(saved.state_dict())
    assert not (live.writer.generations_of(index) == handles).any()
