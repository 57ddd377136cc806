"""TensorStorage / LazyTensorStorage: layouts, data kinds, checkpoints, in-place edits, bad input."""

from __future__ import annotations

import collections
import threading
import time
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict, is_tensor_collection, tensorclass

from tdreplay.core import CheckpointError, ReplayBuffer, TensorDictReplayBuffer
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage, TensorStorage


@tensorclass
class Transition:
    obs: torch.Tensor
    reward: torch.Tensor


@tensorclass
class OtherTransition:
    obs: torch.Tensor
    reward: torch.Tensor


# ---- helpers -----------------------------------------------------------------------------------
def steps(first: int, n: int, inner: tuple[int, ...] = ()) -> TensorDict:
    """Rows of mixed dtypes and nested keys; step ``k`` (C-order over ``[n, *inner]``) holds
    ``obs == k`` and ``next.obs == k + 1``."""
    shape = (n, *inner)
    k = torch.arange(first, first + torch.Size(shape).numel()).reshape(shape)
    return TensorDict(
        {
            "k": k,
            "obs": k[..., None].expand(*shape, 3).to(torch.float32),
            "action": (k % 7).to(torch.int8)[..., None].expand(*shape, 2).clone(),
            "half": k.to(torch.float16),
            ("next", "obs"): (k + 1)[..., None].expand(*shape, 3).to(torch.float32),
            ("next", "done"): (k % 5 == 0)[..., None],
        },
        list(shape),
    )


def check_steps(batch: TensorDict) -> None:
    """Every row is whole: all its entries derive from its own step number."""
    k = batch["k"]
    assert torch.equal(batch["obs"], k[..., None].expand_as(batch["obs"]).float())
    assert torch.equal(batch["next", "obs"], batch["obs"] + 1)
    assert torch.equal(batch["action"], (k % 7).to(torch.int8)[..., None].expand_as(batch["action"]))
    assert torch.equal(batch["next", "done"], (k % 5 == 0)[..., None])


def same(a: Any, b: Any) -> None:
    """Equality of values, dtypes, shapes and types (tensors, TensorDicts, tensorclasses, pytrees)."""
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), (a, b)
    elif is_tensor_collection(a):
        assert a.batch_size == b.batch_size
        ka, kb = sorted(a.keys(True, True), key=str), sorted(b.keys(True, True), key=str)
        assert ka == kb
        for key in ka:
            same(a.get(key), b.get(key))
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            same(x, y)
    elif isinstance(a, dict):
        assert sorted(a) == sorted(b)
        for key in a:
            same(a[key], b[key])
    else:
        assert a == b


def _clone(data: Any) -> Any:
    if isinstance(data, (tuple, list)):
        return type(data)(_clone(x) for x in data)
    if isinstance(data, dict):
        return {k: _clone(v) for k, v in data.items()}
    return data.clone()


def buffer_state(rb: ReplayBuffer) -> dict[str, Any]:
    storage = rb.storage
    return {
        "len": len(rb),
        "write_count": rb.write_count,
        "writer": dict(rb.writer.state_dict()),
        "sampler": dict(rb.sampler.state_dict()),
        "initialized": storage.initialized,
        "shape": storage.shape,
        "contents": None if not storage.initialized or not len(storage) else _clone(rb[:]),
    }


@contextmanager
def unchanged(rb: ReplayBuffer):
    before = buffer_state(rb)
    yield
    after = buffer_state(rb)
    contents_before, contents_after = before.pop("contents"), after.pop("contents")
    assert after == before
    if contents_before is not None:
        same(contents_after, contents_before)


# ---- lazy layout -------------------------------------------------------------------------------
def test_lazy_storage_lays_out_from_the_first_write():
    storage = LazyTensorStorage(10)
    rb = ReplayBuffer(storage=storage)
    assert not storage.initialized and storage.shape is None and len(rb) == 0
    with pytest.raises(RuntimeError, match="never written"):
        storage.get(torch.tensor([0]))
    with pytest.raises(RuntimeError, match="never written"):
        rb[:]
    assert rb.extend(steps(0, 3)).tolist() == [0, 1, 2]
    assert storage.initialized and storage.shape == torch.Size([10]) and len(rb) == 3
    stored = rb[:]
    assert stored.batch_size == torch.Size([3])
    assert {k: v.dtype for k, v in stored.items(True, True)} == {
        "k": torch.int64, "obs": torch.float32, "action": torch.int8, "half": torch.float16,
        ("next", "obs"): torch.float32, ("next", "done"): torch.bool,
    }
    assert stored["obs"].shape == torch.Size([3, 3]) and stored["next", "done"].shape == torch.Size([3, 1])
    same(stored, steps(0, 3))


def test_lazy_storage_lays_out_from_add():
    rb = ReplayBuffer(storage=LazyTensorStorage(4))
    assert rb.add(steps(0, 1)[0]) == 0
    assert rb.storage.shape == torch.Size([4]) and len(rb) == 1
    same(rb[0], steps(0, 1)[0])


def test_sample_is_a_batch_of_written_rows():
    rb = ReplayBuffer(storage=LazyTensorStorage(100), batch_size=32)
    rb.extend(steps(0, 40))
    sample, info = rb.sample(return_info=True)
    assert sample.batch_size == torch.Size([32])
    check_steps(sample)
    assert torch.equal(sample["k"], info["index"])  # step k lives at slot k
    assert int(info["index"].max()) < 40


def test_written_rows_only_in_slices():
    rb = ReplayBuffer(storage=LazyTensorStorage(100))
    rb.extend(steps(0, 15))
    assert len(rb[10:]) == 5 and len(rb[20:]) == 0 and len(rb[:]) == 15
    assert rb[10:]["k"].tolist() == [10, 11, 12, 13, 14]


def test_get_of_unwritten_slots_raises():
    storage = LazyTensorStorage(10)
    rb = ReplayBuffer(storage=storage)
    rb.extend(steps(0, 3))
    with pytest.raises(IndexError, match=r"\[-3, 3\)"):
        storage.get(torch.tensor([1, 5]))
    with pytest.raises(IndexError):
        storage.get(3)
    with pytest.raises(IndexError):
        storage.get(torch.tensor([-4]))
    same(storage.get(torch.tensor([-1])), steps(0, 3)[torch.tensor([2])])  # as storage[-1]
    with pytest.raises(IndexError):
        rb[3]
    same(storage.get(torch.tensor([[2, 0]])), steps(0, 3)[torch.tensor([[2, 0]])])


# ---- wrapping existing data ----------------------------------------------------------------------
def test_wrapping_existing_data_counts_as_full():
    data = steps(0, 6)
    storage = TensorStorage(data)
    assert storage.max_size == 6 and len(storage) == 6 and storage.shape == torch.Size([6])
    rb = ReplayBuffer(storage=storage, batch_size=64, generator=torch.Generator().manual_seed(0))
    same(rb[:], steps(0, 6))
    assert set(rb.sample()["k"].tolist()) == set(range(6))
    assert rb.extend(steps(100, 2)).tolist() == [0, 1]  # a full storage: overwrite from row 0
    assert rb[:]["k"].tolist() == [100, 101, 2, 3, 4, 5]
    assert data["k"].tolist() == [100, 101, 2, 3, 4, 5]  # wrapped in place, not copied
    assert len(rb) == 6


def test_wrapping_a_tensor_and_a_2d_layout():
    storage = TensorStorage(torch.arange(12).reshape(4, 3))
    assert len(storage) == 4 and storage.max_size == 4
    assert storage.get(torch.tensor([3, 0])).tolist() == [[9, 10, 11], [0, 1, 2]]
    storage2 = TensorStorage(steps(0, 4, inner=(5,)), ndim=2)
    assert storage2.max_size == 20 and len(storage2) == 20 and storage2.shape == torch.Size([4, 5])
    assert storage2.get(torch.tensor([7]))["k"].tolist() == [7]


def test_wrapping_checks_max_size_and_dims():
    with pytest.raises(ValueError, match="max_size=5"):
        TensorStorage(steps(0, 6), max_size=5)
    assert TensorStorage(steps(0, 6), max_size=6).max_size == 6
    with pytest.raises(ValueError, match="ndim=2"):
        TensorStorage(steps(0, 6), ndim=2)
    with pytest.raises(ValueError, match="max_size"):
        TensorStorage()
    with pytest.raises(ValueError, match="ndim"):
        LazyTensorStorage(10, ndim=0)


# ---- multi-dimensional layouts -----------------------------------------------------------------
# These test the storage's rows ([rows, *inner], flat C-order slots), so the buffers write batches
# along their first dim (dim_extend=0); the buffer's default, TorchRL's time-major dim_extend =
# ndim - 1, is tested in tdreplay-samplers (test_slice.py, test_prioritized_buffers.py).
def test_ndim2_layout_slots_and_wrap_around():
    rb = ReplayBuffer(storage=LazyTensorStorage(24, ndim=2), batch_size=50, dim_extend=0)
    slots = rb.extend(steps(0, 3, inner=(4,)))
    assert rb.storage.shape == torch.Size([6, 4])  # [max_size // T, T]
    assert slots.shape == torch.Size([3, 4]) and slots.tolist() == torch.arange(12).reshape(3, 4).tolist()
    assert len(rb) == 12 and rb.write_count == 3 and rb.writer.cursor == 3
    assert rb.extend(steps(12, 2, inner=(4,))).tolist() == [[12, 13, 14, 15], [16, 17, 18, 19]]
    wrapped = rb.extend(steps(20, 2, inner=(4,)))  # rows 5 and 0
    assert wrapped.tolist() == [[20, 21, 22, 23], [0, 1, 2, 3]]
    assert len(rb) == 24 and rb.write_count == 7 and rb.writer.cursor == 1
    # flat C-order slots: the step written at slot s is readable at slot s
    got = rb.storage.get(wrapped)
    assert got.batch_size == torch.Size([2, 4])
    assert got["k"].tolist() == [[20, 21, 22, 23], [24, 25, 26, 27]]
    sample, info = rb.sample(return_info=True)
    assert sample.batch_size == torch.Size([50]) and info["index"].shape == torch.Size([50])
    check_steps(sample)
    assert torch.equal(rb.storage.get(info["index"])["k"], sample["k"])


def test_ndim2_reads_count_written_rows():
    rb = ReplayBuffer(storage=LazyTensorStorage(24, ndim=2))
    rb.extend(steps(0, 3, inner=(4,)))
    assert rb[:].batch_size == torch.Size([3, 4])
    assert rb[1:].batch_size == torch.Size([2, 4]) and len(rb[10:]) == 0
    assert rb[-1]["k"].tolist() == [8, 9, 10, 11]


def test_ndim2_add_and_partial_capacity():
    rb = ReplayBuffer(storage=LazyTensorStorage(10, ndim=2), dim_extend=0)  # 10 // 4 = 2 rows of 4
    slots = rb.add(steps(0, 1, inner=(4,))[0])
    assert slots.shape == torch.Size([4]) and slots.tolist() == [0, 1, 2, 3]
    assert rb.storage.shape == torch.Size([2, 4])
    assert rb.extend(steps(4, 2, inner=(4,))).tolist() == [[4, 5, 6, 7], [0, 1, 2, 3]]
    assert len(rb) == 8


def test_ndim3_layout():
    rb = ReplayBuffer(storage=LazyTensorStorage(48, ndim=3), batch_size=8, dim_extend=0)
    slots = rb.extend(steps(0, 2, inner=(3, 4)))
    assert rb.storage.shape == torch.Size([4, 3, 4])
    assert slots.shape == torch.Size([2, 3, 4]) and slots.tolist() == torch.arange(24).reshape(2, 3, 4).tolist()
    one = rb.add(steps(24, 1, inner=(3, 4))[0])
    assert one.shape == torch.Size([3, 4]) and one.flatten().tolist() == list(range(24, 36))
    assert len(rb) == 36
    got = rb.storage.get(torch.tensor([35, 0, 13]))
    assert got["k"].tolist() == [35, 0, 13]
    check_steps(rb.sample())


def test_ndim2_plain_tensors():
    rb = ReplayBuffer(storage=LazyTensorStorage(12, ndim=2), dim_extend=0)
    slots = rb.extend(torch.arange(24.0).reshape(2, 3, 4))
    assert slots.tolist() == [[0, 1, 2], [3, 4, 5]] and rb.storage.shape == torch.Size([4, 3])
    assert rb.storage.get(torch.tensor([4])).tolist() == [[16.0, 17.0, 18.0, 19.0]]


def test_capacity_smaller_than_one_row():
    rb = ReplayBuffer(storage=LazyTensorStorage(3, ndim=2), dim_extend=0)
    with pytest.raises(ValueError, match="max_size=3"):
        rb.extend(steps(0, 1, inner=(4,)))
    assert not rb.storage.initialized and len(rb) == 0 and rb.write_count == 0


# ---- data kinds --------------------------------------------------------------------------------
def test_plain_tensor_data():
    rb = ReplayBuffer(storage=LazyTensorStorage(5), batch_size=4)
    data = torch.arange(21, dtype=torch.int16).reshape(7, 3)
    assert rb.extend(data).tolist() == [0, 1, 2, 3, 4, 0, 1]
    stored = rb[:]
    assert isinstance(stored, torch.Tensor) and stored.dtype == torch.int16
    assert stored.tolist() == [data[5].tolist(), data[6].tolist(), *data[2:5].tolist()]
    sample = rb.sample()
    assert isinstance(sample, torch.Tensor) and sample.shape == torch.Size([4, 3])
    assert rb.add(torch.full((3,), -1, dtype=torch.int16)) == 2
    assert rb[2].tolist() == [-1, -1, -1]


def test_list_of_tensors_and_list_of_tensordicts_are_stacked():
    rb = ReplayBuffer(storage=LazyTensorStorage(5))
    rb.extend([torch.ones(2), torch.zeros(2)])
    assert rb[:].tolist() == [[1.0, 1.0], [0.0, 0.0]]
    rb2 = ReplayBuffer(storage=LazyTensorStorage(5))
    rb2.extend([steps(0, 1)[0], steps(1, 1)[0]])
    same(rb2[:], steps(0, 2))


def test_pytree_data():
    rb = ReplayBuffer(storage=LazyTensorStorage(6), batch_size=5)
    data = (torch.arange(4.0), {"b": torch.arange(8, dtype=torch.uint8).reshape(4, 2)})
    assert rb.extend(data).tolist() == [0, 1, 2, 3]
    assert rb.add((torch.tensor(9.0), {"b": torch.tensor([1, 2], dtype=torch.uint8)})) == 4
    stored = rb[:]
    assert isinstance(stored, tuple) and isinstance(stored[1], dict)
    assert stored[0].tolist() == [0.0, 1.0, 2.0, 3.0, 9.0] and stored[1]["b"].dtype == torch.uint8
    assert stored[1]["b"][4].tolist() == [1, 2]
    sample, info = rb.sample(return_info=True)
    assert sample[0].shape == torch.Size([5]) and sample[1]["b"].shape == torch.Size([5, 2])
    assert torch.equal(sample[1]["b"], stored[1]["b"][info["index"]])


def test_tensorclass_data():
    rb = ReplayBuffer(storage=LazyTensorStorage(6), batch_size=3)
    data = Transition(obs=torch.arange(8.0).reshape(4, 2), reward=torch.arange(4), batch_size=[4])
    rb.extend(data)
    stored = rb[:]
    assert isinstance(stored, Transition) and stored.reward.dtype == torch.int64
    assert torch.equal(stored.obs, data.obs)
    sample = rb.sample()
    assert isinstance(sample, Transition) and sample.batch_size == torch.Size([3])
    assert torch.equal(sample.obs[:, 0], sample.reward.float() * 2)


def test_device_argument():
    for device in ("cpu", torch.device("cpu")):
        rb = ReplayBuffer(storage=LazyTensorStorage(5, device=device), batch_size=2)
        assert rb.storage.device == torch.device("cpu")
        rb.extend(steps(0, 3))
        assert rb.sample().device == torch.device("cpu")
        assert rb[:]["obs"].device == torch.device("cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_device():
    rb = ReplayBuffer(storage=LazyTensorStorage(5, device="cuda"), batch_size=2)
    rb.extend(steps(0, 3))  # CPU data is moved on write
    sample = rb.sample()
    assert sample["obs"].is_cuda
    check_steps(sample)


# ---- TensorDictReplayBuffer --------------------------------------------------------------------
def test_tensordict_buffer_index_with_tensor_storage():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8), batch_size=16)
    data = steps(0, 5)
    assert rb.extend(data).tolist() == [0, 1, 2, 3, 4]
    assert "index" not in data.keys()  # the caller's data as it was
    again = steps(5, 5)
    assert rb.extend(again).tolist() == [5, 6, 7, 0, 1]
    sample = rb.sample()
    check_steps(sample)
    assert torch.equal(sample["k"] % 8, sample["index"])
    assert "index" not in rb[:].keys()
    sample = sample[:5]
    assert rb.extend(sample).tolist() == [2, 3, 4, 5, 6]  # data carrying "index" is written
    assert "index" not in rb[:].keys()


def test_tensordict_buffer_index_with_ndim2():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(24, ndim=2), batch_size=10, dim_extend=0)
    data = steps(0, 2, inner=(4,))
    assert rb.extend(data).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    sample = rb.sample()
    assert sample["index"].shape == torch.Size([10])
    assert torch.equal(sample["k"], sample["index"])


# ---- in-place edits ----------------------------------------------------------------------------
def test_set_and_set_at():
    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    rb.extend(steps(0, 4))
    assert rb.set_("half", torch.full((4,), 2.0)) is rb
    assert rb[:]["half"].tolist() == [2.0] * 4 and rb[:]["half"].dtype == torch.float16
    rb.set_(("next", "obs"), torch.zeros(4, 3))
    assert (rb[:]["next", "obs"] == 0).all()
    assert rb.set_at_("obs", torch.full((2, 3), 7.0), torch.tensor([1, 3])) is rb
    assert rb[:]["obs"][:, 0].tolist() == [0.0, 7.0, 2.0, 7.0]
    rb.extend(steps(4, 1))
    assert rb[4]["half"] == 4.0  # new rows are not affected


def test_update():
    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    rb.extend(steps(0, 3))
    assert rb.update_({"k": torch.tensor([9, 8, 7])}) is rb
    assert rb[:]["k"].tolist() == [9, 8, 7]
    new = steps(100, 3)
    rb.update_(new, keys_to_update=["obs"])
    assert rb[:]["obs"][:, 0].tolist() == [100.0, 101.0, 102.0]
    assert rb[:]["k"].tolist() == [9, 8, 7]  # not in keys_to_update
    source = steps(200, 3)
    rb.update_(source, clone=True)
    source["k"].zero_()
    assert rb[:]["k"].tolist() == [200, 201, 202]


def test_in_place_edit_errors_leave_the_buffer_unchanged():
    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    with pytest.raises(RuntimeError, match="empty"):
        rb.set_("k", torch.zeros(1))
    with pytest.raises(RuntimeError, match="empty"):
        rb.update_({"k": torch.zeros(1)})
    rb.extend(steps(0, 4))
    with unchanged(rb), pytest.raises(KeyError, match="missing"):
        rb.set_("missing", torch.zeros(4))
    with unchanged(rb), pytest.raises(ValueError, match="'obs'"):
        rb.set_("obs", torch.zeros(3, 3))
    with unchanged(rb), pytest.raises(ValueError, match="'obs'"):
        rb.set_at_("obs", torch.zeros(3, 3), torch.tensor([0, 1]))


# ---- bad writes --------------------------------------------------------------------------------
@pytest.fixture
def filled() -> ReplayBuffer:
    rb = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=2)
    rb.extend(steps(0, 7))
    rb.sample()
    return rb


def test_a_batch_numpy_would_broadcast_is_refused(filled):
    # a row shape of 1, or a missing row dim, that a numpy slice assignment would broadcast
    # over the storage's row shape: refused by name, nothing written
    for bad_obs in (torch.zeros(2, 1), torch.zeros(2), torch.zeros(2, 1, 3)):
        bad = steps(7, 2)
        bad["obs"] = bad_obs
        with unchanged(filled), pytest.raises(ValueError, match="'obs' has shape"):
            filled.extend(bad)
        with unchanged(filled), pytest.raises(ValueError, match="'obs' has shape"):
            filled.add(bad[0])  # one item: the same check without the leading dim


def test_shape_mismatch_after_init(filled):
    bad = steps(7, 2)
    bad["obs"] = torch.zeros(2, 4)
    with unchanged(filled), pytest.raises(ValueError, match=r"'obs' has shape \(2, 4\), expected \(2, 3\)"):
        filled.extend(bad)
    bad_wrapping = steps(7, 5)  # crosses the end of the storage: another write path
    bad_wrapping["obs"] = torch.zeros(5, 4)
    with unchanged(filled), pytest.raises(ValueError, match="'obs'"):
        filled.extend(bad_wrapping)
    with unchanged(filled), pytest.raises(ValueError, match="'obs'"):
        filled.add(bad[0])
    with unchanged(filled), pytest.raises(ValueError, match="'obs'"):
        filled[torch.tensor([0, 1])] = bad


def test_key_mismatch_after_init(filled):
    with unchanged(filled), pytest.raises(KeyError, match=r"missing \['half'\]"):
        filled.extend(steps(7, 2).exclude("half"))
    # a new key without a missing one is added as TorchRL's (test_new_key_adds_a_zero_filled...)
    extra = steps(7, 2).exclude("half")
    extra["extra"] = torch.zeros(2)
    with unchanged(filled), pytest.raises(KeyError, match=r"unexpected \['extra'\]"):
        filled.extend(extra)


def test_kind_mismatch_after_init(filled):
    with unchanged(filled), pytest.raises(TypeError, match="tensordict data; got tensor"):
        filled.extend(torch.zeros(2, 3))
    with unchanged(filled), pytest.raises(TypeError, match="a TensorStorage holds"):
        filled.extend(["a", "b"])


def test_pytree_structure_mismatch_after_init():
    rb = ReplayBuffer(storage=LazyTensorStorage(6))
    rb.extend((torch.arange(3.0), {"b": torch.ones(3, 2)}))
    with unchanged(rb), pytest.raises(ValueError, match="pytree structure"):
        rb.extend((torch.arange(3.0), {"c": torch.ones(3, 2)}))
    with unchanged(rb), pytest.raises(ValueError, match="leading"):
        rb.extend((torch.arange(3.0), {"b": torch.ones(2, 2)}))


def test_tensorclass_type_mismatch_after_init():
    rb = ReplayBuffer(storage=LazyTensorStorage(6))
    rb.extend(Transition(obs=torch.zeros(2, 2), reward=torch.zeros(2), batch_size=[2]))
    with unchanged(rb), pytest.raises(TypeError, match="OtherTransition"):
        rb.extend(OtherTransition(obs=torch.zeros(2, 2), reward=torch.zeros(2), batch_size=[2]))


def test_ndim2_inner_mismatch_after_init():
    rb = ReplayBuffer(storage=LazyTensorStorage(24, ndim=2), dim_extend=0)
    rb.extend(steps(0, 2, inner=(4,)))
    with unchanged(rb), pytest.raises(ValueError, match=r"has shape \(1, 5, \d\), expected \(1, 4, \d\)"):
        rb.extend(steps(8, 1, inner=(5,)))


@pytest.mark.parametrize("make", [
    lambda n: TensorDict({"x": torch.zeros(n, 4)}, [n, 4]),
    lambda n: torch.zeros(n, 4),
])
def test_ndim2_batch_of_another_env_count_is_named_in_its_own_layout(make):
    # time-major storage (dim_extend=1): the error speaks of the [envs, T] batch as given, and
    # is a RuntimeError as TorchRL's (and a ValueError); nothing is written
    rb = ReplayBuffer(storage=LazyTensorStorage(20, ndim=2))
    rb.extend(make(2))
    with unchanged(rb), pytest.raises(
            RuntimeError, match=r"batch of shape \[3, 4\].*holds batches of shape \[2, \*\] "
                                r"\(any size along dim 1\)") as caught:
        rb.extend(make(3))
    assert isinstance(caught.value, ValueError)
    assert rb.extend(make(2)).shape == (2, 4)  # the right env count still goes in


def test_first_write_with_too_few_dims_leaves_storage_uninitialized():
    rb = ReplayBuffer(storage=LazyTensorStorage(24, ndim=2), dim_extend=0)
    with pytest.raises(ValueError, match="ndim=2"):
        rb.extend(steps(0, 3))
    with pytest.raises(ValueError, match="ndim=2"):
        rb.extend(torch.zeros(3))
    assert not rb.storage.initialized and len(rb) == 0 and rb.write_count == 0
    assert rb.extend(steps(0, 1, inner=(4,))).tolist() == [[0, 1, 2, 3]]


def test_index_assignment_past_written_rows(filled):
    with unchanged(filled), pytest.raises(IndexError, match="7 rows are written"):
        filled[8] = steps(0, 1)[0]


def test_index_assignment_writes_where_reads_read(filled):
    filled[-1] = steps(50, 1)[0]
    assert filled[-1]["k"] == 50 and filled[6]["k"] == 50 and len(filled) == 7
    filled[:] = steps(20, 7)
    assert filled[:]["k"].tolist() == list(range(20, 27))
    filled.write_all(steps(30, 9))  # past the written rows, up to the capacity
    assert len(filled) == 9 and filled[:]["k"].tolist() == list(range(30, 39))
    # the writer goes on after the rows appended; write_count counts add / extend only
    assert filled.write_count == 7 and filled.writer.cursor == 9


# ---- checkpoints -------------------------------------------------------------------------------
CASES = {
    "tensordict": (lambda: LazyTensorStorage(8), lambda i: steps(10 * i, 3)),
    "ndim2": (lambda: LazyTensorStorage(16, ndim=2), lambda i: steps(10 * i, 1, inner=(4,))),
    "ndim3": (lambda: LazyTensorStorage(36, ndim=3), lambda i: steps(100 * i, 1, inner=(2, 3))),
    "tensor": (lambda: LazyTensorStorage(8), lambda i: torch.arange(6, dtype=torch.int16).reshape(3, 2) + i),
    "pytree": (lambda: LazyTensorStorage(8),
               lambda i: (torch.arange(3.0) + i, {"b": torch.full((3, 2), i, dtype=torch.uint8)})),
    "tensorclass": (lambda: LazyTensorStorage(8),
                    lambda i: Transition(obs=torch.full((3, 2), float(i)), reward=torch.arange(3) + i,
                                         batch_size=[3])),
}


def _make(case: str, seed: int) -> ReplayBuffer:
    return ReplayBuffer(storage=CASES[case][0](), batch_size=5,
                        generator=torch.Generator().manual_seed(seed))


def _fill(rb: ReplayBuffer, case: str, rounds: int) -> None:
    for i in range(rounds):
        rb.extend(CASES[case][1](i))


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("target", ["fresh", "initialized"])
def test_checkpoint_round_trip(tmp_path, case, target):
    rb = _make(case, seed=0)
    _fill(rb, case, 5)  # wraps around
    rb.sample()
    rb.dumps(tmp_path)
    restored = _make(case, seed=1)
    if target == "initialized":
        _fill(restored, case, 1)
    restored.loads(tmp_path)
    same(restored[:], rb[:])
    assert (len(restored), restored.write_count, restored.writer.cursor) == (
        len(rb), rb.write_count, rb.writer.cursor)
    assert restored.storage.shape == rb.storage.shape
    for i in range(5, 7):  # both continue identically
        assert torch.equal(restored.extend(CASES[case][1](i)), rb.extend(CASES[case][1](i)))
        same(restored.sample(), rb.sample())
    same(restored[:], rb[:])


@pytest.mark.parametrize("case", sorted(CASES))
def test_state_dict_round_trip(case):
    rb = _make(case, seed=0)
    _fill(rb, case, 4)
    state = rb.state_dict()
    restored = _make(case, seed=3)
    restored.load_state_dict(state)
    same(restored[:], rb[:])
    same(restored.sample(), rb.sample())
    assert torch.equal(restored.extend(CASES[case][1](9)), rb.extend(CASES[case][1](9)))


def test_checkpoint_of_uninitialized_and_of_emptied_storage(tmp_path):
    ReplayBuffer(storage=LazyTensorStorage(8)).dumps(tmp_path / "fresh")
    rb = ReplayBuffer(storage=LazyTensorStorage(8))
    rb.extend(steps(0, 3))
    rb.loads(tmp_path / "fresh")
    assert len(rb) == 0 and rb.write_count == 0 and rb.writer.cursor == 0
    rb.extend(steps(0, 3))
    rb.empty()
    rb.dumps(tmp_path / "emptied")
    other = ReplayBuffer(storage=LazyTensorStorage(8))
    other.loads(tmp_path / "emptied")
    assert len(other) == 0
    assert other.extend(steps(0, 2)).tolist() == [0, 1]


def test_wrapped_storage_round_trip(tmp_path):
    rb = ReplayBuffer(storage=TensorStorage(steps(0, 6)))
    rb.extend(steps(50, 2))
    rb.dumps(tmp_path)
    target = ReplayBuffer(storage=TensorStorage(steps(0, 6).zero_()))
    target.loads(tmp_path)
    same(target[:], rb[:])
    assert target.writer.cursor == 2 and target.write_count == 2


def test_checkpoint_hooks(tmp_path):
    rb = ReplayBuffer(storage=LazyTensorStorage(8))
    rb.extend(steps(0, 3))
    rb.register_save_hook(lambda td: td.exclude("half").update({"k": td["k"] * 10}))
    rb.dumps(tmp_path)
    full = ReplayBuffer(storage=LazyTensorStorage(8))
    full.extend(steps(0, 1))
    with unchanged(full), pytest.raises(CheckpointError, match="keys"):
        full.loads(tmp_path)  # the saved rows lack "half", which this storage holds
    restored = ReplayBuffer(storage=LazyTensorStorage(8))
    restored.register_load_hook(lambda td: td.set("k", td["k"] + 1))
    restored.loads(tmp_path)
    assert restored[:]["k"].tolist() == [1, 11, 21] and "half" not in restored[:].keys()
    assert rb[:]["k"].tolist() == [0, 1, 2]


@pytest.mark.parametrize(
    "make_other, match",
    [
        (lambda: (LazyTensorStorage(8), steps(0, 2).exclude("half")), "keys"),
        (lambda: (LazyTensorStorage(8), steps(0, 2).update({"obs": torch.zeros(2, 4)})), "row shape"),
        (lambda: (LazyTensorStorage(8), steps(0, 2).update({"obs": torch.zeros(2, 3, dtype=torch.float64)})),
         "dtype"),
        (lambda: (LazyTensorStorage(9), steps(0, 2)), "max_size=9"),
        (lambda: (LazyTensorStorage(8, ndim=2), steps(0, 1, inner=(2,))), "ndim=2"),
        (lambda: (LazyTensorStorage(8), torch.zeros(2, 3)), "tensor data"),
    ],
)
def test_mismatched_checkpoints_are_refused(tmp_path, make_other, match):
    storage, data = make_other()
    other = ReplayBuffer(storage=storage)
    other.extend(data)
    other.dumps(tmp_path)
    rb = ReplayBuffer(storage=LazyTensorStorage(8), batch_size=2)
    rb.extend(steps(0, 5))
    rb.sample()
    with unchanged(rb), pytest.raises(CheckpointError, match=match):
        rb.loads(tmp_path)


def test_mismatched_pytree_and_tensorclass_checkpoints(tmp_path):
    a = ReplayBuffer(storage=LazyTensorStorage(8))
    a.extend((torch.zeros(2), {"c": torch.zeros(2)}))
    a.dumps(tmp_path / "pytree")
    b = ReplayBuffer(storage=LazyTensorStorage(8))
    b.extend((torch.zeros(2), {"b": torch.zeros(2)}))
    with unchanged(b), pytest.raises(CheckpointError, match="treespec"):
        b.loads(tmp_path / "pytree")
    c = ReplayBuffer(storage=LazyTensorStorage(8))
    c.extend(OtherTransition(obs=torch.zeros(2, 2), reward=torch.zeros(2), batch_size=[2]))
    c.dumps(tmp_path / "tc")
    d = ReplayBuffer(storage=LazyTensorStorage(8))
    d.extend(Transition(obs=torch.zeros(2, 2), reward=torch.zeros(2), batch_size=[2]))
    with unchanged(d), pytest.raises(CheckpointError, match="tensorclass"):
        d.loads(tmp_path / "tc")


# ---- threads -----------------------------------------------------------------------------------
def test_extend_while_sampling_never_shows_a_half_written_row():
    capacity, chunk, writes = 256, 16, 2000
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(capacity), batch_size=64)
    rb.extend(steps(0, chunk))
    stop = threading.Event()
    errors: list[BaseException] = []
    samples = [0, 0]

    def writer() -> None:
        try:
            for i in range(1, writes):
                rb.extend(steps(i * chunk, chunk))
                if i == writes // 2:  # halfway, until both learners have sampled (a busy
                    deadline = time.monotonic() + 60  # machine may not have run them yet)
                    while min(samples) == 0 and not errors and time.monotonic() < deadline:
                        time.sleep(0.001)
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)
        finally:
            stop.set()

    def learner(slot: int) -> None:
        try:
            while not stop.is_set():
                batch = rb.sample()
                check_steps(batch)  # a torn row mixes entries of two steps
                assert torch.equal(batch["k"] % capacity, batch["index"])  # and sits at its slot
                samples[slot] += 1
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)
            stop.set()

    threads = [threading.Thread(target=writer)] + [
        threading.Thread(target=learner, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors[0]
    assert samples[0] > 0 and samples[1] > 0
    assert rb.write_count == writes * chunk and len(rb) == capacity
    check_steps(rb[:])


# ---- round-robin property ------------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(
    cap=st.integers(1, 10),
    inner=st.sampled_from([(), (2,), (3,)]),
    sizes=st.lists(st.integers(0, 25), min_size=1, max_size=10),
)
def test_round_robin_slots_match_a_deque(cap, inner, sizes):
    numel = torch.Size(inner).numel()
    rb = ReplayBuffer(storage=LazyTensorStorage(cap * numel, ndim=1 + len(inner)), dim_extend=0)
    model: collections.deque[int] = collections.deque(maxlen=cap)  # row numbers of the last cap rows
    cursor = written = 0
    for n in sizes:
        if n == 0 and not rb.storage.initialized:
            continue
        rows = torch.arange(written, written + n)
        data = steps(written * numel, n, inner)
        slots = rb.extend(data)
        expected_rows = (cursor + torch.arange(n)) % cap
        expected = (expected_rows.reshape(-1, *(1,) * len(inner)) * numel
                    + torch.arange(numel).reshape(inner)) if inner else expected_rows
        assert slots.shape == torch.Size([n, *inner]) and torch.equal(slots, expected)
        model.extend(rows.tolist())
        written += n
        cursor = (cursor + n) % cap
        assert rb.write_count == written and rb.writer.cursor == cursor
        assert len(rb) == len(model) * numel
        stored_rows = (rb[:]["k"].reshape(len(model), -1)[:, 0] // numel).tolist()
        assert stored_rows == sorted(model, key=lambda r: r % cap)


@pytest.mark.parametrize("set_cursor", [True, False])
def test_set_takes_torchrl_set_cursor(set_cursor: bool, tmp_path: Any) -> None:
    # TorchRL's keyword: accepted by every storage, no effect (the writer holds the cursor)
    from tdreplay.core import ListStorage
    from tdreplay.storages import LazyMemmapStorage
    td = TensorDict({"x": torch.arange(3.0)}, [3])
    for storage in (LazyTensorStorage(5), LazyMemmapStorage(5, scratch_dir=tmp_path / "m"),
                    ListStorage(5)):
        storage.set(torch.arange(3), td if not isinstance(storage, ListStorage) else list(td),
                    set_cursor=set_cursor)
        storage.set(1, td[0], set_cursor=set_cursor)
        assert len(storage) == 3
        got = storage.get(torch.tensor([0, 1, 2]))
        x = torch.stack([t["x"] for t in got]) if isinstance(got, list) else got["x"]
        assert x.tolist() == [0.0, 0.0, 2.0]


def test_new_key_adds_a_zero_filled_entry_as_torchrl(tmp_path: Any) -> None:
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(6))
    rb.extend(TensorDict({"obs": torch.arange(4.0)}, [4]))
    part = rb[1:3]
    part["value"] = part["obs"] + 10
    rb[1:3] = part  # TorchRL adds the entry; the rows not written hold zeros
    assert rb[:]["value"].tolist() == [0.0, 11.0, 12.0, 0.0]
    assert rb[:]["obs"].tolist() == [0.0, 1.0, 2.0, 3.0] and len(rb) == 4
    # a refused write adds nothing: here the new entry comes with an existing one of bad shape
    bad = TensorDict({"obs": torch.zeros(2, 3), "value": torch.zeros(2), "other": torch.zeros(2)},
                     [2])
    with pytest.raises(ValueError, match="'obs'"):
        rb.extend(bad)
    assert sorted(rb[:].keys()) == ["obs", "value"] and len(rb) == 4
    # missing keys stay refused (TorchRL would leave those rows' entries stale)
    with pytest.raises(KeyError, match="data keys do not match"):
        rb.extend(TensorDict({"obs": torch.ones(2)}, [2]))
    # memory-mapped storages do not add files other processes would not see
    from tdreplay.storages import LazyMemmapStorage
    mm = TensorDictReplayBuffer(storage=LazyMemmapStorage(6, scratch_dir=tmp_path / "m"))
    mm.extend(TensorDict({"obs": torch.arange(4.0)}, [4]))
    everything = mm[:]
    everything["value"] = everything["obs"]
    with pytest.raises(KeyError, match="unexpected"):
        mm[:] = everything
    assert list(mm[:].keys()) == ["obs"]


@pytest.mark.parametrize("lanes", [1, 2])
@pytest.mark.parametrize("dim_extend", [0, 1])
def test_extend_returns_slots_shaped_like_the_batch_of_any_lane_count(lanes, dim_extend):
    # a storage of one lane ([N, 1]) returned [T] slots for a [T, 1] batch (rows_to_slots
    # skipped the lane dim whenever a row holds one slot)
    shape = (4, lanes) if dim_extend == 0 else (lanes, 4)
    rb = ReplayBuffer(storage=LazyTensorStorage(8, ndim=2), dim_extend=dim_extend)
    data = TensorDict({"x": torch.arange(4 * lanes).reshape(shape)}, list(shape))
    slots = rb.extend(data)
    assert slots.shape == shape
    assert torch.equal(rb.storage.get(slots.reshape(-1))["x"], data["x"].reshape(-1))


@pytest.mark.parametrize("empty", [[], torch.zeros(0, 3), TensorDict({"x": torch.zeros(0)}, [0])],
                         ids=["list", "tensor", "tensordict"])
def test_an_empty_batch_into_a_storage_never_written_writes_nothing(empty, tmp_path):
    # (the writer asked the unwritten storage for its row capacity first: extend([]) raised
    # "cannot write an empty list to a TensorStorage", where a written storage returned [])
    for storage in (LazyTensorStorage(10), LazyMemmapStorage(10, scratch_dir=tmp_path / "m")):
        rb = ReplayBuffer(storage=storage)
        slots = rb.extend(empty)
        assert slots.tolist() == [] and slots.dtype == torch.long
        assert len(rb) == 0 and rb.write_count == 0 and not storage.initialized
        assert rb.extend(torch.ones(2, 3)).tolist() == [0, 1]
