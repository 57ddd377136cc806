"""TensorDictMaxValueWriter: a bad saved ``age`` / ``write_count`` is refused before a buffer
loads anything, and a rejected write leaves the writer's state exactly as it was."""

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ListStorage, TensorDictReplayBuffer
from tdreplay.writers import TensorDictMaxValueWriter


def make(capacity: int = 10) -> TensorDictReplayBuffer:
    return TensorDictReplayBuffer(storage=ListStorage(capacity), batch_size=2,
                                  writer=TensorDictMaxValueWriter(rank_key="r"))


def rows(values, rank=None) -> TensorDict:
    values = torch.as_tensor(values, dtype=torch.float32)
    rank = values if rank is None else torch.as_tensor(rank, dtype=torch.float32)
    return TensorDict({"x": values, "r": rank}, [values.shape[0]])


@pytest.mark.parametrize("key", ["age", "write_count"])
@pytest.mark.parametrize("value", [None, "bad", -1, 2.5, True])
def test_a_bad_counter_is_refused_before_the_buffer_changes(key, value):
    src = make()
    src.extend(rows(range(8)))
    state = src.state_dict()
    state["_writer"][key] = value
    rb = make()
    rb.extend(rows([-1.0, -2.0, -3.0], rank=[0.0, 1.0, 2.0]))
    writer_before = rb.writer.state_dict()
    with pytest.raises(ValueError, match=f"{key}'\\]? (must be|is)"):
        rb.load_state_dict(state)
    assert len(rb) == 3 and rb.write_count == 3
    assert sorted(item["x"].item() for item in rb[:]) == [-3.0, -2.0, -1.0]
    assert _same(rb.writer.state_dict(), writer_before)


class RefusingStorage(ListStorage):
    """A list storage that refuses writes once ``refuse`` is set (as a tensor storage refuses
    rows of another shape)."""

    refuse = False

    def set(self, *args, **kwargs):
        if self.refuse:
            raise ValueError("refused by the storage")
        return super().set(*args, **kwargs)


def test_a_rejected_write_leaves_the_writer_state_unchanged():
    storage = RefusingStorage(5)
    rb = TensorDictReplayBuffer(storage=storage, writer=TensorDictMaxValueWriter(rank_key="r"))
    rb.extend(rows(range(5)))
    before = rb.writer.state_dict()
    storage.refuse = True
    for ranks in ([10.0, 11.0, 12.0], [2.5, 10.0, 0.5]):  # each replaces kept rows
        with pytest.raises(ValueError, match="refused by the storage"):
            rb.extend(rows(ranks))
        assert _same(rb.writer.state_dict(), before)
    storage.refuse = False
    assert sorted(item["r"].item() for item in rb[:]) == [0.0, 1.0, 2.0, 3.0, 4.0]


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a)


@pytest.mark.parametrize("bad", [
    lambda d: d.exclude("x"),                          # a key missing
    lambda d: d.set("x", torch.zeros(2, 3)),           # another shape
    lambda d: d.set("x", torch.zeros(2, 2, 2)),        # more dims
], ids=["missing-key", "shape", "more-dims"])
def test_a_bad_batch_is_refused_even_when_no_row_ranks_high_enough(bad):
    # whether bad data is refused no longer depends on its ranks (it was accepted, and the
    # writer's age advanced, when every row ranked too low to be kept)
    from tdreplay.storages import LazyTensorStorage
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(4), batch_size=2,
                                writer=TensorDictMaxValueWriter(rank_key="r"))
    rb.extend(rows([10.0, 11.0, 12.0, 13.0]))
    writer_before = rb.writer.state_dict()
    with pytest.raises((KeyError, ValueError, TypeError)):
        rb.extend(bad(rows([1.0, 2.0])))  # ranks 1 and 2: below every kept one
    assert _same(rb.writer.state_dict(), writer_before)
    assert rb[:]["x"].tolist() == [10.0, 11.0, 12.0, 13.0]
    assert rb.extend(rows([1.0, 2.0])).tolist() == [-1, -1]  # good low-ranked data: not kept
    assert rb.writer.state_dict()["age"] == writer_before["age"] + 2


def test_a_heap_that_ranks_more_rows_than_the_saved_storage_is_refused():
    """A writer state of another storage state that ranks rows the storage state does not hold
    (the next extend failed) is refused before the buffer changes."""
    saved_rows = 9
    full = make(4)
    full.extend(rows([10.0, 20.0, 30.0, 40.0]))
    other = make(10)
    other.extend(rows(range(saved_rows)))
    state = full.state_dict()
    state["_writer"] = other.state_dict()["_writer"]
    rb = make(4)
    rb.extend(rows([5.0]))
    writer_before = rb.writer.state_dict()
    with pytest.raises(ValueError, match=f"ranks {saved_rows} rows but the storage state holds 4"):
        rb.load_state_dict(state)
    assert len(rb) == 1 and rb[:][0]["x"].item() == 5.0
    assert _same(rb.writer.state_dict(), writer_before)
    rb.load_state_dict(full.state_dict())  # its own writer state loads
    rb.extend(rows([1.0]))  # ranks below every kept row: not written
    assert sorted(item["x"].item() for item in rb[:]) == [10.0, 20.0, 30.0, 40.0]


def _item(rank: float, x: torch.Tensor | None = None) -> TensorDict:
    return TensorDict({"r": torch.tensor(rank), "x": torch.zeros(2) if x is None else x}, [])


@pytest.mark.parametrize("bad", [
    lambda d: d.exclude("x"),                          # a key missing
    lambda d: d.set("x", torch.zeros(3)),              # another shape
    lambda d: d.set("x", torch.zeros(2, dtype=torch.float64).fill_(0.5)),  # another dtype, fits
], ids=["missing-key", "shape", "dtype"])
def test_a_bad_item_ranked_too_low_is_refused_after_good_ones_were(bad):
    # a refused add of an item of the leaves the storage last accepted is not checked again
    # (the check cost 4x the rest of an add): any other item still is
    from tdreplay.storages import LazyTensorStorage
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(3),
                                writer=TensorDictMaxValueWriter(rank_key="r"))
    for rank in (10.0, 11.0, 12.0, 1.0, 2.0):  # the last two: ranked too low
        rb.add(_item(rank))
    item = bad(_item(0.5))
    if "x" in item.keys() and item["x"].dtype == torch.float64:
        assert rb.add(item) is None  # a lossless cast: accepted, not kept
    else:
        with pytest.raises((KeyError, ValueError)):
            rb.add(item)
    assert rb.add(_item(3.0)) is None
    assert sorted(rb[:]["r"].tolist()) == [10.0, 11.0, 12.0]
    assert rb.writer.state_dict()["age"] == 6 + ("x" in item.keys() and item["x"].dtype
                                                  == torch.float64)



def test_a_new_storage_checks_an_item_again():
    from tdreplay.storages import LazyTensorStorage
    writer = TensorDictMaxValueWriter(rank_key="r")
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(2), writer=writer)
    for rank in (5.0, 6.0, 1.0):  # the last: refused, checked, its leaves remembered
        rb.add(_item(rank))
    other = TensorDictReplayBuffer(storage=LazyTensorStorage(2), writer=writer)
    for rank in (5.0, 6.0):
        other.add(TensorDict({"r": torch.tensor(rank), "y": torch.zeros(2)}, []))
    with pytest.raises(KeyError, match=r"missing \['y'\], unexpected \['x'\]"):
        other.add(_item(1.0))  # the remembered leaves: checked again by the new storage


def test_a_low_ranked_item_with_a_meta_leaf_is_refused_after_good_ones():
    # (the remembered leaves named key, shape and dtype only: a meta 'x' of the same shape
    # skipped the storage's check)
    from tdreplay.storages import LazyTensorStorage
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(2),
                                writer=TensorDictMaxValueWriter(rank_key="r"))
    for rank in (5.0, 6.0, 1.0):
        rb.add(_item(rank))
    with pytest.raises(ValueError, match="meta tensor"):
        rb.add(_item(0.5, torch.empty(2, device="meta")))


def test_an_item_that_grows_the_storage_drops_the_remembered_leaves():
    # (a kept item with a new entry made the storage add it; a low-ranked item of the old
    # leaves then skipped the check that refuses it)
    from tdreplay.storages import LazyTensorStorage
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(2),
                                writer=TensorDictMaxValueWriter(rank_key="r"))
    for rank in (5.0, 6.0, 1.0):  # the last: refused, its leaves remembered
        rb.add(_item(rank))
    grown = _item(9.0)
    grown["extra"] = torch.ones(2)
    assert rb.add(grown) is not None  # kept: the storage gains 'extra'
    with pytest.raises(KeyError, match=r"missing \['extra'\]"):
        rb.add(_item(0.5))


def test_a_storage_built_over_data_round_trips_with_its_free_rows():
    """``TensorStorage(data)`` holds rows the heap does not rank: they are the writer's free
    rows, before and after ``state_dict`` / ``load_state_dict`` (its own state was refused)."""
    from tdreplay.storages import TensorStorage

    def build():
        data = TensorDict({"r": torch.zeros(4), "x": torch.full((4,), -1.0)}, [4])
        return TensorDictReplayBuffer(storage=TensorStorage(data),
                                      writer=TensorDictMaxValueWriter(rank_key="r"))

    rb = build()
    rb.extend(TensorDict({"r": torch.tensor([1.0, 2.0]), "x": torch.tensor([1.0, 2.0])}, [2]))
    restored = build()
    restored.load_state_dict(rb.state_dict())
    rb.load_state_dict(rb.state_dict())
    for buffer in (rb, restored):
        assert buffer[:]["x"].tolist() == [1.0, 2.0, -1.0, -1.0]
        ranks = torch.tensor([5.0, 0.5, 3.0])
        more = TensorDict({"r": ranks, "x": ranks.clone()}, [3])
        # rows 2 and 3 are free: 5.0 takes row 2; 0.5 would take row 3 and be evicted by 3.0 of
        # the same batch, so 3.0 takes it (the writer's batch rule)
        assert buffer.extend(more).tolist() == [2, -1, 3]
        assert buffer[:]["x"].tolist() == [1.0, 2.0, 5.0, 3.0]
