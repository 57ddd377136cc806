"""Data of another dtype than a tensor storage's entry (issue 18 item 8): lossy casts are refused
naming the key and both dtypes, before anything is written; lossless and common casts work."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage

STORAGES = {
    "lazy": lambda tmp: LazyTensorStorage(10),
    "memmap": lambda tmp: LazyMemmapStorage(10, scratch_dir=tmp / "scratch"),
}
# (entry dtype, data written, what the entry reads back) for casts that keep every value
ACCEPTED = [
    (torch.float32, torch.tensor([1, 2], dtype=torch.int64), [1.0, 2.0]),
    (torch.float32, torch.tensor([0.5, -1e30], dtype=torch.float64), None),  # rounded
    (torch.float32, torch.tensor([float("nan"), float("inf")], dtype=torch.float64), None),
    (torch.int64, torch.tensor([True, False]), [1, 0]),
    (torch.int64, torch.tensor([3, -4], dtype=torch.int32), [3, -4]),
    (torch.int32, torch.tensor([2**31 - 1, -(2**31)]), [2**31 - 1, -(2**31)]),
    (torch.uint8, torch.tensor([0, 255]), [0, 255]),
    (torch.bool, torch.tensor([0, 1]), [False, True]),
    (torch.float16, torch.tensor([1.5, 65504.0]), [1.5, 65504.0]),
    (torch.float64, torch.tensor([0.1], dtype=torch.float32).expand(2), None),
    (torch.complex64, torch.tensor([1.0, 2.0]), None),
]
# (entry dtype, data written, error, what the message says)
REFUSED = [
    (torch.int64, torch.tensor([0.7, 1.0]), TypeError, "fractional part"),
    (torch.int64, torch.tensor([1.0, 2.0], dtype=torch.float64), TypeError, "fractional part"),
    (torch.bool, torch.tensor([0.0, 1.0]), TypeError, "fractional part"),
    (torch.float32, torch.tensor([1.0, 1e300], dtype=torch.float64), ValueError,
     r"turn 1e\+300 into inf"),
    (torch.float16, torch.tensor([1.0, 70000.0]), ValueError, "turn 70000.0 into inf"),
    (torch.float16, torch.tensor([1, 70000]), ValueError, "turn 70000 into inf"),
    (torch.int32, torch.tensor([1, 2**40]), ValueError, "wrap 1099511627776"),
    (torch.uint8, torch.tensor([1, -1]), ValueError, "wrap -1"),
    (torch.bool, torch.tensor([1, 2]), ValueError, "turn 2 into True"),
    (torch.float32, torch.tensor([1 + 1j, 2j]), TypeError, "imaginary part"),
]


def laid_out(kind: str, tmp_path, dtype: torch.dtype):
    storage = STORAGES[kind](tmp_path)
    storage.set(slice(0, 2), TensorDict({"a": torch.full((2,), 9.0),
                                         "x": torch.zeros(2, dtype=dtype)}, [2]))
    return storage


def writes(storage, x):
    """Every way a write reaches the storage: a slice, a tensor of rows, one row."""
    other = torch.full((2,), 5.0)
    yield lambda: storage.set(slice(0, 2), TensorDict({"a": other, "x": x}, [2]))
    yield lambda: storage.set(torch.tensor([0, 1]), TensorDict({"a": other, "x": x}, [2]))
    yield lambda: storage.set(1, TensorDict({"a": other[0], "x": x[1]}, []))


@pytest.mark.parametrize("kind", sorted(STORAGES))
@pytest.mark.parametrize(("dtype", "x", "expected"), ACCEPTED,
                         ids=[f"{d}<-{x.dtype}" for d, x, _ in ACCEPTED])
def test_casts_that_keep_every_value_are_accepted(tmp_path, kind, dtype, x, expected):
    storage = laid_out(kind, tmp_path, dtype)
    for write in writes(storage, x):
        write()
    read = storage[:]["x"]
    assert read.dtype == dtype
    assert torch.equal(read, x.to(dtype)) or (read.isnan() == x.to(dtype).isnan()).all()
    if expected is not None:
        assert read.tolist() == expected


@pytest.mark.parametrize("kind", sorted(STORAGES))
@pytest.mark.parametrize(("dtype", "x", "error", "match"), REFUSED,
                         ids=[f"{d}<-{x.dtype}" for d, x, _, _ in REFUSED])
def test_lossy_casts_are_refused_naming_key_and_dtypes_before_any_write(tmp_path, kind, dtype, x,
                                                                       error, match):
    storage = laid_out(kind, tmp_path, dtype)
    for write in writes(storage, x):
        with pytest.raises(error, match=match) as info:
            write()
        message = str(info.value)
        assert "entry 'x'" in message and str(x.dtype) in message and str(dtype) in message
    rows = storage[:]
    assert len(storage) == 2
    assert torch.equal(rows["a"], torch.full((2,), 9.0))  # the entry before "x": untouched
    assert torch.equal(rows["x"], torch.zeros(2, dtype=dtype))


def test_set_key_refuses_lossy_values_and_casts_the_others():
    storage = LazyTensorStorage(4)
    storage.set(slice(0, 2), TensorDict({"i": torch.zeros(2, dtype=torch.long),
                                         "f": torch.zeros(2)}, [2]))
    with pytest.raises(TypeError, match="entry 'i'"):
        storage.set_key("i", 0.7)
    with pytest.raises(ValueError, match="entry 'f'"):
        storage.set_key("f", torch.tensor(1e300, dtype=torch.float64))
    storage.set_key("i", 3)
    storage.set_key("f", 2)  # an int into a float entry
    storage.set_key("f", torch.tensor([0.25, 0.5], dtype=torch.float64))
    assert storage[:]["i"].tolist() == [3, 3] and storage[:]["f"].tolist() == [0.25, 0.5]


def test_buffer_extend_of_a_lossy_cast_changes_nothing():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8), batch_size=2)
    rb.extend(TensorDict({"action": torch.tensor([1, 2])}, [2]))
    with pytest.raises(TypeError, match="action"):
        rb.extend(TensorDict({"action": torch.tensor([0.7, 1.2])}, [2]))
    assert len(rb) == 2 and rb.storage[:]["action"].tolist() == [1, 2]
    rb.extend(TensorDict({"action": torch.tensor([3, 4], dtype=torch.int32)}, [2]))
    assert rb.storage[:]["action"].tolist() == [1, 2, 3, 4]
