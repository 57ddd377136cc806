"""A number (Python ``bool`` / ``int`` / ``float``, a numpy scalar) written into a storage of
plain tensors: ``rb[0] = 3.0``, ``storage[0] = 3.0``, ``storage.set(0, 3.0)``, ``rb[1:3] = 7``
write it at those rows, cast to the storage's dtype and broadcast over an item's shape, as
torch's (and TorchRL's) ``t[0] = 3.0``; a lossy cast is refused as for a tensor, naming the
argument; a storage of TensorDicts, tensorclasses or pytrees refuses a number, naming the
argument and what it holds. A refused write leaves the buffer exactly as it was."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ReplayBuffer
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage


def _buffer(data, storage=None):
    rb = ReplayBuffer(storage=storage if storage is not None else LazyTensorStorage(10))
    rb.extend(data)
    return rb


def _state(rb):
    return rb.storage[:].clone(), len(rb), rb.storage.last_written_row, rb.write_count


def _same(before, after):
    data, *rest = before
    new, *new_rest = after
    return (
        data.dtype == new.dtype
        and data.shape == new.shape
        and bool((data == new).all())
        and rest == new_rest
    )


@pytest.mark.parametrize("write", ["buffer", "storage", "set"])
def test_a_float_is_written_at_an_int_row(write):
    rb = _buffer(torch.arange(5.0))
    if write == "buffer":
        rb[0] = 3.0
    elif write == "storage":
        rb.storage[0] = 3.0
    else:
        rb.storage.set(0, 3.0, set_cursor=False)
    out = rb.storage[:]
    assert out.dtype is torch.float32 and out.tolist() == [3.0, 1.0, 2.0, 3.0, 4.0]
    assert len(rb) == 5


def test_an_int_at_a_slice_is_broadcast_over_the_rows():
    rb = _buffer(torch.arange(5.0))
    rb[1:3] = 7
    assert rb[:].tolist() == [0.0, 7.0, 7.0, 3.0, 4.0]
    rb.storage.set(slice(3, 5), np.float32(-1), set_cursor=False)
    rb[torch.tensor([0, 4])] = True
    assert rb[:].tolist() == [1.0, 7.0, 7.0, -1.0, 1.0] and len(rb) == 5


def test_a_number_is_broadcast_over_an_item_shape():
    rb = _buffer(torch.zeros(4, 2))
    rb[0] = 2.5
    rb[2:4] = 1
    rb.storage.set([1], np.int16(4), set_cursor=False)
    assert rb[:].tolist() == [[2.5, 2.5], [4.0, 4.0], [1.0, 1.0], [1.0, 1.0]]


def test_items_without_dims():
    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    for v in (0.0, 1.0, 2.0):
        rb.add(torch.tensor(v))
    rb[1] = 5.0
    rb.storage[-1] = 6
    rb.add(7.0)  # one more item (a number of the storage's kind: a tensor item)
    assert rb.storage[:].tolist() == [0.0, 5.0, 6.0, 7.0] and len(rb) == 4


def test_cast_to_the_storage_dtype():
    rb = _buffer(torch.zeros(3, dtype=torch.int8))
    rb[0] = 5
    rb[1] = np.int64(-7)
    rb[2] = True
    out = rb.storage[:]
    assert out.dtype is torch.int8 and out.tolist() == [5, -7, 1]
    rb = _buffer(torch.zeros(2, dtype=torch.float64))
    rb[0] = 0.1  # float64 kept exactly
    assert rb.storage[:][0].item() == 0.1


def test_ndim2_tuple_index():
    rb = _buffer(torch.zeros(2, 6), LazyTensorStorage(12, ndim=2))  # rb[i, j]: [envs, time]
    rb[1, 2] = 5.0
    rb[:, 3] = 9
    rb.storage[0, 1] = 4  # the storage's own layout: [time, envs]
    expected = torch.zeros(2, 6)
    expected[1, 2], expected[:, 3], expected[1, 0] = 5.0, 9.0, 4.0
    assert torch.equal(rb[:], expected)


def test_memmap_and_compilable_storages():
    for storage in (LazyMemmapStorage(10), LazyTensorStorage(10, compilable=True)):
        rb = _buffer(torch.zeros(3, 2), storage)
        rb[1] = 2.0
        rb[0:2] = 1
        rb.storage.set(2, 7, set_cursor=False)
        assert rb.storage[:].tolist() == [[1.0, 1.0], [1.0, 1.0], [7.0, 7.0]]


@pytest.mark.parametrize(
    "value, error, match",
    [
        (
            3.0,
            TypeError,
            r"^value=3.0 \(float, written as torch.float64 data\) into the storage's "
            r"torch.int64 data would lose the fractional part",
        ),
        (2.5, TypeError, r"^value=2.5 .*would lose the fractional part"),
        (np.float32(4), TypeError, r"^value=np.float32\(4.0\) \(float32.*fractional part"),
        (1j, TypeError, r"^value=1j .*imaginary part"),
        (
            2**70,
            ValueError,
            r"^value=1180591620717411303424 \(int\) does not fit the storage's "
            r"torch.int64 data",
        ),
    ],
)
def test_a_lossy_cast_is_refused_naming_the_argument(value, error, match):
    rb = _buffer(torch.arange(5))
    before = _state(rb)
    with pytest.raises(error, match=match):
        rb[0] = value
    with pytest.raises(error, match=match):
        rb.storage[1:3] = value
    with pytest.raises(error, match=match.replace("value", "data")):
        rb.storage.set(0, value)
    with pytest.raises(error, match=match.replace("value", "data")):
        rb.add(value)
    assert _same(before, _state(rb))


def test_values_out_of_a_narrower_dtype_are_refused():
    rb = _buffer(torch.zeros(3, dtype=torch.int8))
    before = _state(rb)
    with pytest.raises(ValueError, match=r"^value=300 .*torch.int8 data would wrap 300 around"):
        rb[0] = 300
    f32 = _buffer(torch.zeros(3))
    f32_before = _state(f32)
    with pytest.raises(ValueError, match=r"^value=1e\+300 .*would turn 1e\+300 into inf"):
        f32[0:2] = 1e300
    flags = _buffer(torch.zeros(3, dtype=torch.bool))
    flags_before = _state(flags)
    with pytest.raises(ValueError, match=r"^value=2 .*torch.bool data would turn 2 into True"):
        flags[1] = 2
    assert _same(before, _state(rb)) and _same(f32_before, _state(f32))
    assert _same(flags_before, _state(flags))


def test_a_tensordict_storage_refuses_a_number():
    rb = _buffer(TensorDict({"a": torch.zeros(3)}, [3]))
    before = rb.storage[:].clone()
    match = (
        r"^value=3.0: a number is written only into a storage of tensors; this storage "
        r"holds tensordict data: write a TensorDict there"
    )
    with pytest.raises(TypeError, match=match):
        rb[0] = 3.0
    with pytest.raises(TypeError, match=match):
        rb.storage[0:2] = 3.0
    with pytest.raises(TypeError, match=match.replace("value", "data")):
        rb.storage.set(0, 3.0)
    with pytest.raises(TypeError, match=match.replace("value", "data")):
        rb.add(3.0)
    assert (rb.storage[:] == before).all() and len(rb) == 3 and rb.write_count == 3


def test_ndim2_tensordict_storage_refuses_a_number_at_a_tuple_index():
    rb = _buffer(TensorDict({"a": torch.zeros(2, 3)}, [2, 3]), LazyTensorStorage(6, ndim=2))
    with pytest.raises(TypeError, match=r"^value=1: a number .* holds tensordict data"):
        rb[0, 1] = 1
    assert (rb[:]["a"] == 0).all()


def test_a_pytree_storage_and_a_storage_never_written_refuse_a_number():
    storage = LazyTensorStorage(10)
    storage.set(slice(0, 3), (torch.zeros(3), torch.ones(3)))
    with pytest.raises(TypeError, match=r"^value=3.0: .*holds pytree data: write a pytree"):
        storage[0] = 3.0
    assert storage[:][0].tolist() == [0.0] * 3 and storage[:][1].tolist() == [1.0] * 3
    fresh = LazyTensorStorage(10)
    with pytest.raises(TypeError, match=r"^data=3.0: .*this storage was never written"):
        fresh.set(0, 3.0)
    assert not fresh.initialized
