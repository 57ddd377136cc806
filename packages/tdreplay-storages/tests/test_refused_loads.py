"""Refused writes and loads leave a storage as it was, a lazy storage unlaid (issue 18 item 12):
meta-device data, a ``state_dict`` or checkpoint of another capacity, with more rows than fit,
or of another layout."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import CheckpointError, ReplayBuffer, TensorDictReplayBuffer
from tdreplay.storages import (
    CompressedListStorage,
    FlatStorageCheckpointer,
    H5StorageCheckpointer,
    LazyMemmapStorage,
    LazyTensorStorage,
    NestedStorageCheckpointer,
    TensorStorage,
    TensorStorageCheckpointer,
)

STORAGES = {
    "lazy": lambda n, tmp, **kw: LazyTensorStorage(n, **kw),
    "memmap": lambda n, tmp, **kw: LazyMemmapStorage(n, scratch_dir=tmp / f"scratch{n}", **kw),
}
CHECKPOINTERS = {
    "tensor": TensorStorageCheckpointer,
    "flat": FlatStorageCheckpointer,
    "nested": NestedStorageCheckpointer,
    "h5": H5StorageCheckpointer,
}


def rows(n: int, width: int = 3, value: float = 1.0) -> TensorDict:
    return TensorDict({"obs": torch.full((n, width), value), "a": torch.arange(n)}, [n])


@pytest.mark.parametrize("kind", sorted(STORAGES))
def test_meta_tensors_are_refused_before_the_first_write_lays_out(tmp_path, kind):
    storage = STORAGES[kind](10, tmp_path)
    meta = TensorDict({"obs": torch.zeros(2, 3, device="meta"), "a": torch.arange(2)}, [2])
    with pytest.raises(ValueError, match="entry 'obs' is a meta tensor"):
        storage.set(slice(0, 2), meta)
    with pytest.raises(ValueError, match="meta tensor"):
        storage.set(0, meta[0])
    assert not storage.initialized and len(storage) == 0
    storage.set(slice(0, 2), rows(2, width=5))  # real data of another shape is laid out
    assert storage.shape == torch.Size([10]) and storage[1]["obs"].shape == (5,)


def test_wrapping_meta_tensors_is_refused():
    with pytest.raises(ValueError, match="meta tensor"):
        TensorStorage(TensorDict({"obs": torch.zeros(4, device="meta")}, [4]))


def test_meta_first_extend_of_a_buffer_leaves_it_unlaid():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10), batch_size=2)
    with pytest.raises(ValueError, match="meta tensor"):
        rb.extend(TensorDict({"obs": torch.zeros(4, 3, device="meta")}, [4]))
    assert len(rb) == 0 and not rb.storage.initialized
    rb.extend(TensorDict({"obs": torch.zeros(4, 7)}, [4]))
    assert rb.sample()["obs"].shape == (2, 7)


@pytest.mark.parametrize("kind", sorted(STORAGES))
@pytest.mark.parametrize("with_max_size", [True, False])
def test_state_of_a_bigger_storage_is_refused_and_the_storage_stays_unlaid(tmp_path, kind,
                                                                          with_max_size):
    big = STORAGES[kind](20, tmp_path)
    big.set(slice(0, 15), rows(15))
    state = big.state_dict()
    if not with_max_size:  # a state saved before max_size was recorded: its rows do not fit
        del state["max_size"]
    small = STORAGES[kind](10, tmp_path)
    match = "max_size" if with_max_size else "15 rows, more than the 10 rows"
    with pytest.raises(ValueError, match=match):
        small.check_state_dict(state)
    with pytest.raises(ValueError, match=match):
        small.load_state_dict(state)
    assert not small.initialized and len(small) == 0
    small.set(slice(0, 2), rows(2, width=4))  # free to lay out from other data
    assert small[:]["obs"].shape == (2, 4)


@pytest.mark.parametrize("kind", sorted(STORAGES))
def test_state_of_another_layout_is_refused_and_the_storage_is_unchanged(tmp_path, kind):
    source = STORAGES[kind](10, tmp_path)
    source.set(slice(0, 3), rows(3, width=5))
    target = STORAGES[kind](10, tmp_path / "t")
    target.set(slice(0, 2), rows(2, value=7.0))
    with pytest.raises(ValueError, match="shape"):
        target.load_state_dict(source.state_dict())
    same_shape = STORAGES[kind](10, tmp_path / "s")
    same_shape.set(slice(0, 3), rows(3))
    state = same_shape.state_dict()
    state["storage"] = state["storage"].apply(lambda x: x.double() if x.is_floating_point()
                                              else x)
    with pytest.raises(ValueError, match="dtype"):
        target.check_state_dict(state)
    state = dict(same_shape.state_dict(), len_rows=2)  # metadata and rows disagree
    with pytest.raises(ValueError, match="3 rows"):
        target.load_state_dict(state)
    assert len(target) == 2 and torch.equal(target[:]["obs"], torch.full((2, 3), 7.0))


def test_unwritten_state_loads_and_round_trips_keep_working():
    source = LazyTensorStorage(10)
    target = LazyTensorStorage(10)
    target.load_state_dict(source.state_dict())
    assert not target.initialized
    source.set(slice(0, 4), rows(4))
    target.load_state_dict(source.state_dict())
    assert len(target) == 4 and torch.equal(target[:]["obs"], source[:]["obs"])


def test_buffer_refuses_the_state_of_a_bigger_buffer_changing_nothing():
    big = TensorDictReplayBuffer(storage=LazyTensorStorage(20), batch_size=2)
    big.extend(rows(15))
    small = TensorDictReplayBuffer(storage=LazyTensorStorage(10), batch_size=2)
    with pytest.raises(ValueError, match="max_size"):
        small.load_state_dict(big.state_dict())
    assert len(small) == 0 and not small.storage.initialized


@pytest.mark.parametrize("ckpt_name", sorted(CHECKPOINTERS))
@pytest.mark.parametrize("kind", sorted(STORAGES))
def test_checkpoint_of_another_capacity_is_refused_and_the_storage_stays_unlaid(
        tmp_path, ckpt_name, kind):
    if ckpt_name == "h5":
        pytest.importorskip("h5py")
    ckpt = CHECKPOINTERS[ckpt_name]
    big = STORAGES[kind](20, tmp_path, checkpointer=ckpt())
    big.set(slice(0, 15), rows(15))
    big.dumps(tmp_path / "ckpt")
    small = STORAGES[kind](10, tmp_path, checkpointer=ckpt())
    with pytest.raises(CheckpointError, match="max_size"):
        small.loads(tmp_path / "ckpt")
    assert not small.initialized and len(small) == 0


@pytest.mark.parametrize("ckpt_name", sorted(CHECKPOINTERS))
def test_checkpoint_rows_that_do_not_fit_an_unlaid_storage_leave_it_unlaid(tmp_path, ckpt_name):
    if ckpt_name == "h5":
        pytest.importorskip("h5py")
    # a storage of 10 slots in rows of 4 steps lays out 2 rows; the checkpoint has 3 such rows
    ckpt = CHECKPOINTERS[ckpt_name]
    source = LazyTensorStorage(12, ndim=2, checkpointer=ckpt())
    source.set(slice(0, 3), TensorDict({"obs": torch.ones(3, 4)}, [3, 4]))
    state = source.state_dict()
    target = LazyTensorStorage(12, ndim=2, checkpointer=ckpt())
    del state["max_size"]
    target.load_state_dict(state)  # same capacity: loads
    assert len(target) == 12
    narrow = LazyTensorStorage(10, ndim=2)
    with pytest.raises(ValueError, match="3 rows, more than the 2 rows"):
        narrow.load_state_dict(state)
    assert not narrow.initialized


def test_compressed_state_and_checkpoint_of_another_capacity_are_refused(tmp_path):
    big = CompressedListStorage(8)
    big.set(torch.arange(3), torch.arange(12).reshape(3, 4))
    small = CompressedListStorage(4)
    with pytest.raises(ValueError, match="max_size"):
        small.load_state_dict(big.state_dict())
    big.dumps(tmp_path)
    with pytest.raises(CheckpointError, match="max_size=8"):
        small.loads(tmp_path)
    assert len(small) == 0
    state = big.state_dict()
    del state["max_size"]  # an older state: its 3 rows fit, it loads
    small.load_state_dict(state)
    assert small.get(torch.tensor([2])).tolist() == [[8, 9, 10, 11]]
    rb = ReplayBuffer(storage=CompressedListStorage(4))
    with pytest.raises(ValueError, match="max_size"):
        rb.load_state_dict(ReplayBuffer(storage=CompressedListStorage(8)).state_dict())


DAMAGED_STATES = {
    "an unknown kind": ({"kind": "fish"}, r"(data of kind 'fish', none of|state holds fish data)"),
    "no kind": ({"kind": None}, r"(data of kind None|state holds None data)"),
    "initialized not a bool": ({"initialized": 1}, r"\['initialized'\] must be True with saved rows"),
    "initialized without rows": ({"storage": None}, r"\['initialized'\] must be True with saved rows"),
}


@pytest.mark.parametrize("kind", sorted(STORAGES))
@pytest.mark.parametrize("damage", sorted(DAMAGED_STATES))
def test_damaged_state_is_refused_and_the_buffer_unchanged(tmp_path, kind, damage):
    """A damaged ``state_dict`` loaded into a laid out storage, or into a lazy one, is refused
    (it loaded before, and the buffer could then neither read nor write: an unknown kind, or
    rows dropped because ``initialized`` was a falsy non-bool)."""
    source = TensorDictReplayBuffer(storage=STORAGES[kind](10, tmp_path / "a"))
    source.extend(rows(4))
    changes, message = DAMAGED_STATES[damage]
    state = source.state_dict()
    state["_storage"] = {**state["_storage"], **changes}
    for written in (0, 3):
        rb = TensorDictReplayBuffer(storage=STORAGES[kind](10, tmp_path / f"b{written}"))
        if written:
            rb.extend(rows(written, value=7.0))
        with pytest.raises(ValueError, match=message):
            rb.load_state_dict(state)
        assert len(rb) == written and rb.write_count == written
        assert rb.storage.initialized == bool(written)
        if written:
            assert torch.equal(rb[:]["obs"], torch.full((written, 3), 7.0))


def test_uninitialized_state_of_an_unwritten_storage_still_loads():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10))
    rb.load_state_dict(TensorDictReplayBuffer(storage=LazyTensorStorage(10)).state_dict())
    assert len(rb) == 0 and not rb.storage.initialized
    rb.extend(rows(2))
    assert rb[:]["a"].tolist() == [0, 1]


@pytest.mark.parametrize("kind", sorted(STORAGES))
def test_state_whose_writer_cursor_is_past_the_saved_rows_is_refused(tmp_path, kind):
    source = TensorDictReplayBuffer(storage=STORAGES[kind](10, tmp_path / "a"))
    source.extend(rows(6))
    state = source.state_dict()
    storage_state = dict(state["_storage"])
    storage_state["storage"], storage_state["len_rows"] = storage_state["storage"][:3], 3
    state["_storage"] = storage_state
    rb = TensorDictReplayBuffer(storage=STORAGES[kind](10, tmp_path / "b"))
    rb.extend(rows(2, value=7.0))
    with pytest.raises(ValueError, match=r"'cursor'\] is 6 but the storage state holds 3 rows"):
        rb.load_state_dict(state)
    assert len(rb) == 2 and rb.writer.cursor == 2
    state["_writer"] = {**state["_writer"], "cursor": 3}
    rb.load_state_dict(state)  # the cursor at the saved rows: the next write follows them
    rb.extend(rows(1, value=9.0))
    assert rb[:]["obs"][:, 0].tolist() == [1.0, 1.0, 1.0, 9.0]
