"""HostRows: numpy's row take where it is faster, torch's index_select elsewhere, the same
rows, dtypes and shapes either way; row writes through numpy views where numpy sees both sides,
through torch otherwise, the same values either way."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ReplayBuffer
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage
from tdreplay.storages._host_rows import PARALLEL_GRAIN, HostRows

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.uint8, torch.bool,
          torch.complex64]


def _leaf(dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    values = torch.arange(int(np.prod(shape))).reshape(shape)
    return (values % 2).to(dtype) if dtype is torch.bool else values.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_take_equals_index_select(dtype):
    leaves = [_leaf(dtype, (50, 3, 2)), _leaf(dtype, (50,))]
    slots = torch.tensor([49, 0, 7, 7, 13])
    got = HostRows(leaves).take(slots)
    for leaf, rows in zip(leaves, got):
        assert rows.dtype is leaf.dtype and rows.shape == (5, *leaf.shape[1:])
        assert torch.equal(rows, torch.index_select(leaf, 0, slots))
        assert rows.is_contiguous()


def test_numpy_takes_the_leaves_it_can_see_and_torch_the_others():
    gather = HostRows([torch.zeros(4, 2), torch.zeros(4, dtype=torch.bfloat16),
                        torch.zeros(4, requires_grad=True)])
    assert [host is not None for host in gather.host] == [True, False, False]
    assert gather.row_numel == [2, 1, 1]


@pytest.mark.parametrize("threads", [1, 4])
def test_leaves_numpy_cannot_see_mixed_with_those_it_can(monkeypatch, threads):
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    leaves = [_leaf(torch.float32, (30, 2)), _leaf(torch.bfloat16, (30,)),
              _leaf(torch.int64, (30, 3))]
    gather = HostRows(leaves)
    assert gather.all_views is None  # the bfloat16 leaf: not every leaf has a view
    slots = torch.tensor([29, 0, 3, 3])
    for leaf, rows in zip(leaves, gather.take(slots)):
        assert rows.dtype is leaf.dtype and torch.equal(rows, leaf[slots])


def test_rows_are_copies_that_own_their_memory():
    leaf = torch.arange(10.0).reshape(5, 2)
    rows = HostRows([leaf]).take(torch.tensor([1, 3]))[0]
    rows += 100
    assert leaf[1].tolist() == [2.0, 3.0]  # the storage's row is untouched
    assert rows.tolist() == [[102.0, 103.0], [106.0, 107.0]]


def test_large_gathers_on_several_threads_stay_with_index_select(monkeypatch):
    # above torch's grain on several threads, index_select (parallel) gathers; the same rows
    leaf = _leaf(torch.float32, (PARALLEL_GRAIN, 2))
    slots = torch.randint(0, PARALLEL_GRAIN, (PARALLEL_GRAIN // 2,))
    calls = []
    real_index_select = torch.index_select
    monkeypatch.setattr(torch, "index_select",
                        lambda *a, **k: calls.append(1) or real_index_select(*a, **k))
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    rows = HostRows([leaf]).take(slots)[0]
    assert calls == [1] and torch.equal(rows, leaf[slots])
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    rows = HostRows([leaf]).take(slots)[0]
    assert calls == [1] and torch.equal(rows, leaf[slots])  # numpy's take, no index_select


@pytest.mark.parametrize("storage", ["tensor", "memmap"])
def test_buffers_sample_the_stored_rows(storage, tmp_path):
    make = (LazyTensorStorage(20) if storage == "tensor"
            else LazyMemmapStorage(20, scratch_dir=tmp_path))
    rb = ReplayBuffer(storage=make)
    data = TensorDict({"x": torch.arange(20.0), "n": {"m": torch.arange(40).reshape(20, 2)},
                       "done": torch.arange(20) % 3 == 0}, [20])
    rb.extend(data)
    slots = torch.tensor([[19, 0], [5, 5]])
    got = rb.storage.get(slots)
    assert got.batch_size == (2, 2)
    assert got["x"].tolist() == [[19.0, 0.0], [5.0, 5.0]]
    assert got["n", "m"].tolist() == [[[38, 39], [0, 1]], [[10, 11], [10, 11]]]
    assert got["done"].dtype is torch.bool and got["done"].tolist() == [[False, True],
                                                                         [False, False]]
    sample = rb.sample(64)
    assert torch.equal(sample["n", "m"][:, 0], 2 * sample["x"].long())
    assert torch.equal(sample["done"], sample["x"].long() % 3 == 0)


def test_two_dim_storage_gathers_flat_slots():
    storage = LazyTensorStorage(12, ndim=2)
    rb = ReplayBuffer(storage=storage)
    slots = rb.extend(TensorDict({"x": torch.arange(12.0).reshape(4, 3)}, [4, 3]))
    # each item comes back from the flat slot extend reported for it
    assert storage.get(slots)["x"].tolist() == torch.arange(12.0).reshape(4, 3).tolist()
    assert storage.get(slots[2, 1].reshape(1))["x"].tolist() == [7.0]


def test_a_leaf_whose_memory_moves_is_read_where_it_now_is():
    leaf = torch.arange(8.0).reshape(4, 2)
    gather = HostRows([leaf])
    assert gather.take(torch.tensor([1]))[0].tolist() == [[2.0, 3.0]]
    old_pointer = leaf.data_ptr()
    leaf.share_memory_()  # torch moves the memory (as when the tensor goes to a process)
    assert leaf.data_ptr() != old_pointer
    leaf[1] = torch.tensor([-1.0, -2.0])
    assert gather.take(torch.tensor([1, 3]))[0].tolist() == [[-1.0, -2.0], [6.0, 7.0]]
    assert gather.pointers == [leaf.data_ptr()]


@pytest.mark.parametrize("dtype", DTYPES)
def test_put_writes_the_rows_numpy_can_see_and_refuses_the_others(dtype):
    leaves = [_leaf(dtype, (6, 2)), _leaf(torch.float32, (6,))]
    before = [leaf.clone() for leaf in leaves]
    sources = [_leaf(dtype, (2, 2)).flip(0), torch.tensor([-1.0, -2.0])]
    written = HostRows(leaves).put(3, 5, sources)
    assert written is (dtype is not torch.bfloat16)  # numpy has no bfloat16: torch copies
    if not written:
        assert all(torch.equal(a, b) for a, b in zip(leaves, before))  # nothing written
        return
    assert torch.equal(leaves[0][3:5], sources[0]) and leaves[1][3:5].tolist() == [-1.0, -2.0]
    assert torch.equal(leaves[0][:3], before[0][:3]) and torch.equal(leaves[0][5:], before[0][5:])


@pytest.mark.parametrize("source", ["other dtype", "requires grad", "non-contiguous"])
def test_put_leaves_sources_numpy_cannot_take_as_they_are(source):
    leaf = torch.zeros(5, 3)
    if source == "other dtype":
        src = torch.ones(2, 3, dtype=torch.float64)
    elif source == "requires grad":
        src = torch.ones(2, 3, requires_grad=True)
    else:  # numpy takes strided memory: written
        src = torch.arange(6.0).reshape(3, 2).t()
    written = HostRows([leaf]).put(1, 3, [src])
    assert written is (source == "non-contiguous")
    expected = torch.zeros(5, 3)
    if written:
        expected[1:3] = src
    assert torch.equal(leaf, expected)


@pytest.mark.parametrize("shape", [(2, 3), (2, 1), (3,), (1, 3), (2, 3, 1)])
def test_put_with_shapes_writes_sources_of_exactly_those_shapes_only(shape):
    # with ``shapes`` the sources are unchecked: any other shape (which numpy would
    # broadcast, or refuse half-way) writes nothing and leaves the check to the caller
    leaves = [torch.zeros(5, 3), torch.zeros(5, dtype=torch.int64)]
    src = torch.arange(float(np.prod(shape))).reshape(shape)
    written = HostRows(leaves).put(1, 3, [src, torch.tensor([7, 8])], shapes=[(2, 3), (2,)])
    assert written is (shape == (2, 3))
    if written:
        assert torch.equal(leaves[0][1:3], src) and leaves[1].tolist() == [0, 7, 8, 0, 0]
    else:
        assert not leaves[0].any() and not leaves[1].any()


def test_put_with_shapes_refuses_another_dtype_and_checks_the_shapes_of_each_call():
    leaf = torch.zeros(6, 2)
    rows = HostRows([leaf])
    assert not rows.put(0, 2, [torch.ones(2, 2, dtype=torch.float64)], shapes=[(2, 2)])
    assert rows.put(0, 3, [torch.ones(3, 2)], shapes=[(3, 2)])  # another batch size: its shapes
    assert not rows.put(3, 5, [torch.ones(3, 2)], shapes=[(2, 2)])
    assert leaf.sum().item() == 6.0


def test_put_writes_where_a_moved_leaf_now_is():
    leaf = torch.zeros(4, 2)
    rows = HostRows([leaf])
    leaf.share_memory_()  # torch moves the memory
    assert rows.put(0, 1, [torch.ones(1, 2)])
    assert leaf[0].tolist() == [1.0, 1.0]


def test_storages_write_through_numpy_and_torch_alike():
    # the same batches into a storage whose leaves numpy sees and into one with a bfloat16
    # leaf (every write through torch): the same rows
    def filled(dtype):
        rb = ReplayBuffer(storage=LazyTensorStorage(8))
        for start in (0, 5):
            rb.extend(TensorDict({"x": torch.arange(start, start + 5.0),
                                  "y": torch.arange(start, start + 5).to(dtype)}, [5]))
        return rb.storage.get(torch.arange(8))
    plain, mixed = filled(torch.float32), filled(torch.bfloat16)
    assert plain["x"].tolist() == mixed["x"].tolist() == [8, 9, 2, 3, 4, 5, 6, 7]
    assert plain["y"].tolist() == mixed["y"].float().tolist()


def test_two_dim_storage_writes_each_environments_steps_to_its_slots():
    # 12 slots as 6 rows of 2 environments: each extend of [2 envs, 3 steps] fills 3 rows
    storage = LazyTensorStorage(12, ndim=2)
    rb = ReplayBuffer(storage=storage)
    first = rb.extend(TensorDict({"x": torch.arange(6.0).reshape(2, 3)}, [2, 3]))
    steps = -1 - torch.arange(6.0).reshape(2, 3)
    second = rb.extend(TensorDict({"x": steps}, [2, 3]))
    assert storage.get(second)["x"].tolist() == steps.tolist()
    assert storage.get(first)["x"].tolist() == torch.arange(6.0).reshape(2, 3).tolist()
    # rows 3-5 hold the second batch, time-major: row 3 is step 0 of both environments
    assert storage.get(torch.arange(6, 12))["x"].tolist() == [-1, -4, -2, -5, -3, -6]


def test_put_takes_one_item_without_its_leading_dim():
    leaves = [torch.zeros(4, 2), torch.zeros(4, dtype=torch.int64)]
    assert HostRows(leaves).put(2, 3, [torch.tensor([1.0, 2.0]), torch.tensor(7)])
    assert leaves[0].tolist() == [[0, 0], [0, 0], [1, 2], [0, 0]]
    assert leaves[1].tolist() == [0, 0, 7, 0]


def test_a_wrapped_two_dim_storage_whose_leaf_is_not_contiguous_reads_what_it_writes():
    # a transposed [rows, envs] leaf: flattening its slots would copy it, so the layout holds a
    # contiguous copy and reads and writes one memory
    from tdreplay.storages import TensorStorage

    leaf = torch.arange(12.0).reshape(3, 4).t()  # 4 rows of 3 environments
    storage = TensorStorage(TensorDict({"x": leaf}, [4, 3]), ndim=2)
    assert storage.get(torch.tensor([3, 4, 5]))["x"].tolist() == [1.0, 5.0, 9.0]  # row 1
    storage.set(slice(1, 2), TensorDict({"x": -torch.ones(1, 3)}, [1, 3]))
    assert storage.get(torch.tensor([3, 4, 5]))["x"].tolist() == [-1.0, -1.0, -1.0]
    assert storage.get(torch.tensor([0, 6]))["x"].tolist() == [0.0, 2.0]


@pytest.mark.parametrize("ndim", [1, 2])
def test_a_leaf_of_no_elements_is_written_with_the_others(ndim):
    # rows of a leaf shaped [*batch, 0] in a storage of several dims were flattened with
    # reshape(-1, 0), which numpy refuses: the extend raised after the leaves before it were
    # already written. Now it writes every leaf, and reads them back.
    shape = [6] if ndim == 1 else [3, 2]
    data = TensorDict({"a": torch.arange(6.).reshape(shape), "empty": torch.zeros(*shape, 0),
                       "z": -torch.arange(6).reshape(shape)}, shape)
    rb = ReplayBuffer(storage=LazyTensorStorage(12, ndim=ndim))
    rb.extend(data)
    rb.extend(data + 1)
    stored = rb[:]
    assert stored["empty"].shape == (*stored.batch_size, 0)
    expected = torch.cat([data, data + 1], dim=ndim - 1)
    assert torch.equal(stored["a"], expected["a"]) and torch.equal(stored["z"], expected["z"])


def test_a_write_that_does_not_convert_writes_no_leaf():
    # every source is converted (and a storage of several dims' rows flattened) before the
    # first leaf is written: a failure on a later leaf leaves the earlier ones untouched
    leaves = [torch.zeros(4, 2), torch.zeros(4, 3)]
    rows = HostRows(leaves)
    assert not rows.put(0, 2, [torch.ones(2, 2), torch.ones(2, 3, dtype=torch.float64)])
    assert not rows.put(0, 2, [torch.ones(1, 2, 2), torch.ones(1, 2, 5)])
    assert torch.equal(leaves[0], torch.zeros(4, 2)) and torch.equal(leaves[1], torch.zeros(4, 3))
