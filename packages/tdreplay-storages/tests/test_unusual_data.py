"""Data a tensor storage cannot hold whole, refused before anything is written: dtypes torch
cannot copy into scattered rows (a write that wrapped failed half-way: a memmap ring dropped
rows), meta and sparse entries of later writes, preallocated rows that share memory; data
that requires grad is stored detached; a namedtuple pytree says why it cannot be saved."""

from __future__ import annotations

import collections
import gc
import weakref

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ReplayBuffer
from tdreplay.storages import (
    CompressedListStorage,
    LazyMemmapStorage,
    LazyTensorStorage,
    TensorStorage,
)

STORAGES = {
    "lazy": lambda tmp: LazyTensorStorage(4),
    "memmap": lambda tmp: LazyMemmapStorage(4, scratch_dir=tmp / "scratch"),
}


def _rows(a: float, b: torch.Tensor) -> TensorDict:
    return TensorDict({"a": torch.full((b.shape[0],), a), "b": b}, [b.shape[0]])


@pytest.mark.parametrize("kind", sorted(STORAGES))
@pytest.mark.parametrize(("dtype", "instead"), [
    (torch.uint16, "torch.int32.*view\\(torch.int16\\)"), (torch.uint32, "torch.int64"),
    (torch.float8_e4m3fn, "torch.float16"), (torch.float8_e5m2, "torch.float16")])
def test_dtypes_torch_cannot_scatter_are_refused_at_the_first_write(kind, dtype, instead,
                                                                     tmp_path):
    # (the first write went in, a wrapping extend failed after writing 'a': the memmap ring
    # dropped the rows it had begun, 3 rows became 1)
    rb = ReplayBuffer(storage=STORAGES[kind](tmp_path))
    with pytest.raises(TypeError, match=rf"entry 'b' has dtype {dtype}.*{instead}"):
        rb.extend(_rows(1.0, torch.ones(3, 2).to(dtype)))
    assert len(rb) == 0 and rb.writer.cursor == 0
    rb.extend(_rows(1.0, torch.ones(3, 2, dtype=torch.int32)))  # the remedy works
    rb.extend(_rows(7.0, torch.ones(3, 2, dtype=torch.int32)))
    assert rb.storage[:]["a"].tolist() == [7.0, 7.0, 1.0, 7.0]


def test_a_preallocated_storage_of_such_a_dtype_is_refused():
    with pytest.raises(TypeError, match="entry 'x' has dtype torch.uint16"):
        TensorStorage(TensorDict({"x": torch.zeros(4, dtype=torch.uint16)}, [4]))


@pytest.mark.parametrize("dtype", [torch.uint16, torch.float8_e4m3fn])
def test_a_compressed_storage_holds_them(dtype):
    rb = ReplayBuffer(storage=CompressedListStorage(4))
    batch = torch.arange(6).reshape(3, 2).to(dtype)
    rb.extend(TensorDict({"b": batch}, [3]))
    rb.extend(TensorDict({"b": batch}, [3]))  # slots 3, 0, 1
    got = rb[:]["b"]
    assert got.dtype == dtype
    assert got.float().tolist() == [[2, 3], [4, 5], [4, 5], [0, 1]]


BAD_LEAVES = {
    "meta": lambda: torch.empty(2, 2, device="meta"),
    "sparse": lambda: torch.ones(2, 2).to_sparse(),
}


@pytest.mark.parametrize("bad", sorted(BAD_LEAVES))
@pytest.mark.parametrize("how", ["extend", "setitem_row", "setitem_rows"])
@pytest.mark.parametrize("kind", ["lazy", "preallocated"])
def test_a_meta_or_sparse_entry_of_a_later_write_writes_nothing(bad, how, kind):
    # (the shape-and-dtype check passed them: 'a' was written, then torch raised on 'b')
    if kind == "lazy":
        storage = LazyTensorStorage(4)
    else:
        storage = TensorStorage(TensorDict({"a": torch.zeros(4, 2), "b": torch.zeros(4, 2)},
                                           [4]))
    rb = ReplayBuffer(storage=storage)
    rb.extend(TensorDict({"a": torch.ones(2, 2), "b": torch.ones(2, 2)}, [2]))
    before = rb.storage[:].clone()
    batch = TensorDict({"a": torch.full((2, 2), 7.0), "b": BAD_LEAVES[bad]()}, [2])
    with pytest.raises(ValueError, match=f"entry 'b' is a .*{bad}"):
        if how == "extend":
            rb.extend(batch)
        elif how == "setitem_row":
            rb[0] = batch[0]
        else:
            rb[torch.tensor([1, 0])] = batch
    after = rb.storage[:]
    assert torch.equal(after["a"], before["a"]) and torch.equal(after["b"], before["b"])
    assert rb.writer.cursor == 2


@pytest.mark.parametrize("bad", sorted(BAD_LEAVES))
def test_a_compressed_storage_names_a_meta_or_sparse_entry(bad):
    rb = ReplayBuffer(storage=CompressedListStorage(4))
    rb.extend(TensorDict({"a": torch.ones(2, 2), "b": torch.ones(2, 2)}, [2]))
    with pytest.raises(ValueError, match=f"entry 'b' is a .*{bad}"):
        rb.extend(TensorDict({"a": torch.ones(2, 2), "b": BAD_LEAVES[bad]()}, [2]))
    with pytest.raises(ValueError, match=f"data is a .*{bad}"):
        ReplayBuffer(storage=CompressedListStorage(4)).add(BAD_LEAVES[bad]()[0])
    assert len(rb) == 2 and rb[:]["b"].tolist() == [[1.0, 1.0], [1.0, 1.0]]


def test_preallocated_rows_that_share_memory_are_refused():
    # (TensorStorage(proto.expand(8)): a write of 2 rows turned all 8 into the last one)
    proto = TensorDict({"x": torch.zeros(3)}, [])
    with pytest.raises(ValueError, match=r"entry .x. .*shares memory.*24 elements in 3 locations.*\.clone\(\)"):
        TensorStorage(proto.expand(8))
    storage = TensorStorage(proto.expand(8).clone())
    rb = ReplayBuffer(storage=storage)
    rb.extend(TensorDict({"x": torch.arange(6.0).reshape(2, 3)}, [2]))
    assert rb.storage[:]["x"][:3].tolist() == [[0, 1, 2], [3, 4, 5], [0, 0, 0]]


@pytest.mark.parametrize("kind", sorted(STORAGES))
def test_data_that_requires_grad_is_stored_detached(kind, tmp_path):
    # (the storage's leaves took the graph: every batch ever written stayed reachable, and
    # rb[:] backpropagated into the network that made it)
    rb = ReplayBuffer(storage=STORAGES[kind](tmp_path))
    weight = torch.ones(2, requires_grad=True)
    outputs = []
    for step in range(3):
        out = weight * step
        outputs.append(weakref.ref(out))
        rb.extend(TensorDict({"x": out.expand(2, 2)}, [2]))
        rb[0] = TensorDict({"x": weight * 5}, [])
        rb[torch.tensor([1])] = TensorDict({"x": (weight * 6).expand(1, 2)}, [1])
        del out
    gc.collect()
    assert [ref() for ref in outputs] == [None, None, None]  # no graph kept alive
    for read in (rb[:], rb.storage[:], rb.sample(2)):
        assert not read["x"].requires_grad and read["x"].grad_fn is None
    assert rb.storage[:]["x"].tolist() == [[5, 5], [6, 6], [1, 1], [1, 1]]


def test_an_edit_with_a_value_that_requires_grad_is_stored_detached():
    rb = ReplayBuffer(storage=LazyTensorStorage(4))
    rb.extend(TensorDict({"x": torch.zeros(2, 2)}, [2]))
    weight = torch.ones(2, requires_grad=True)
    rb.storage.set_key("x", weight * 3)
    got = rb.storage[:]["x"]
    assert not got.requires_grad and got.tolist() == [[3, 3], [3, 3]]


def test_a_namedtuple_pytree_says_why_it_cannot_be_saved(tmp_path):
    Pair = collections.namedtuple("Pair", "a b")
    rb = ReplayBuffer(storage=LazyTensorStorage(4), batch_size=2)
    rb.extend(Pair(torch.arange(2.0), torch.arange(2) + 10))
    for save in (rb.state_dict, lambda: rb.dumps(tmp_path / "ckpt")):
        with pytest.raises(TypeError, match="pytree structure torch cannot save.*tuples or dicts"):
            save()
    assert len(rb) == 2 and rb[:].b.tolist() == [10, 11]  # the buffer goes on
    rb.extend(Pair(torch.arange(2.0), torch.arange(2)))
    assert len(rb) == 4


def test_a_float_into_a_bool_entry_is_refused_saying_what_it_would_become():
    rb = ReplayBuffer(storage=LazyTensorStorage(4))
    rb.extend(TensorDict({"done": torch.tensor([True, False])}, [2]))
    with pytest.raises(TypeError, match=r"0\.7 would be stored as True; floating point data is "
                                        "refused there whatever its values"):
        rb.extend(TensorDict({"done": torch.tensor([1.0, 0.0])}, [2]))


@pytest.mark.parametrize("bad", sorted(BAD_LEAVES))
@pytest.mark.parametrize("how", ["update_", "index_tuple", "set_key", "ndim2_item"])
def test_a_meta_or_sparse_value_of_an_in_place_edit_writes_nothing(bad, how):
    # (update_ and storage[(rows,)] = td wrote 'a', then torch raised on a sparse 'b')
    ndim = 2 if how == "ndim2_item" else 1
    rb = ReplayBuffer(storage=LazyTensorStorage(8, ndim=ndim))
    shape = (2, 2) if ndim == 2 else (4,)
    rb.extend(TensorDict({"a": torch.zeros(*shape, 3), "b": torch.zeros(*shape, 2)}, shape))
    storage = rb.storage
    before = storage[:].clone()
    value = {"meta": lambda *s: torch.empty(*s, device="meta"),
             "sparse": lambda *s: torch.ones(*s).to_sparse()}[bad]
    with pytest.raises(ValueError, match=f"'b' is a .*{bad}"):
        if how == "update_":
            storage.update_(TensorDict({"a": torch.ones(4, 3), "b": value(4, 2)}, [4]))
        elif how == "index_tuple":
            storage[(slice(0, 2),)] = TensorDict({"a": torch.ones(2, 3), "b": value(2, 2)}, [2])
        elif how == "set_key":
            storage.set_key("b", value(4, 2))
        else:
            rb[0, 1] = TensorDict({"a": torch.ones(3), "b": value(2)}, [])
    after = storage[:]
    assert torch.equal(after["a"], before["a"]) and torch.equal(after["b"], before["b"])


def test_preallocated_rows_that_overlap_without_a_zero_stride_are_refused():
    # (overlapping windows: writing row 0 changed rows 1 and 2)
    with pytest.raises(ValueError, match=r"24 elements in 10 locations"):
        TensorStorage(TensorDict({"x": torch.zeros(10).unfold(0, 3, 1)}, [8]))
    one = TensorStorage(TensorDict({"x": torch.zeros(4, 3)[:, None, :]}, [4]))  # a size-1 dim
    ReplayBuffer(storage=one).extend(TensorDict({"x": torch.ones(2, 1, 3)}, [2]))
    assert one[:]["x"].sum() == 6


@pytest.mark.parametrize("leaf", [True, False])
def test_preallocated_tensors_that_require_grad_are_held_detached(leaf):
    # (a leaf: the first extend raised torch's "a view of a leaf Variable..."; a non-leaf:
    # reads came back attached to its graph)
    weight = torch.ones(2, requires_grad=True)
    data = torch.zeros(4, 2, requires_grad=True) if leaf else torch.zeros(4, 2) * weight
    rb = ReplayBuffer(storage=TensorStorage(TensorDict({"x": data}, [4])))
    rb.extend(TensorDict({"x": torch.ones(2, 2)}, [2]))
    for read in (rb[:], rb.sample(2), rb.storage[:]):
        assert not read["x"].requires_grad
    assert rb[:]["x"][:, 0].tolist() == [1.0, 1.0, 0.0, 0.0]


def test_data_of_a_refused_dtype_is_cast_into_an_existing_entry():
    # (only an entry laid out in that dtype is refused: extend refused uint16 values that
    # set_key cast into the same float32 entry)
    rb = ReplayBuffer(storage=LazyTensorStorage(4))
    rb.extend(TensorDict({"x": torch.zeros(2, 3)}, [2]))
    rb.extend(TensorDict({"x": torch.full((2, 3), 7, dtype=torch.uint16)}, [2]))
    assert rb.storage[:]["x"].dtype == torch.float32 and rb.storage[:]["x"][2:].sum() == 42


def test_a_restore_installs_rows_of_a_refused_dtype():
    # (0.5.0 wrote such checkpoints: the first-write check refused loading them)
    source = LazyTensorStorage(10)
    source.set(torch.arange(3), TensorDict({"x": torch.arange(3, dtype=torch.int16)}, [3]))
    data = TensorDict({"x": source.written_rows()["x"].view(torch.uint16)}, [3])
    target = LazyTensorStorage(10)
    target.check_layout_compatible(source.layout_meta(), data)
    target.install(source.layout_meta(), data)
    got = target.get(torch.tensor([2, 0]))["x"]
    assert got.dtype == torch.uint16 and got.to(torch.int32).tolist() == [2, 0]
