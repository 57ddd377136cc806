"""A boolean mask indexes a ``ListStorage`` as torch's ``t[mask]`` and the tensor storages do:
the rows marked ``True``, for reads (``storage.get(mask)``, ``storage[mask]``, ``rb[mask]``)
and writes (``storage.set(mask, data)``, ``storage[mask] = data``, ``rb[mask] = data``). Reads
refused a mask and ``set`` refused it while ``storage[mask] = data`` took it. A mask of
another shape or length, one marking unwritten rows, or a ``uint8`` index (torch reads it as
a mask, TorchRL's list storage as rows) is refused naming the argument, nothing written.
TorchRL 0.14.1's ``ListStorage.get(mask)`` reads ``True``/``False`` as rows 1/0."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tdreplay.core import ListStorage, ReplayBuffer
from tdreplay.core.testing import assert_same, buffer_snapshot

ITEMS = ["a", "b", "c", "d", "e"]
MASK = torch.tensor([True, False, True, False, True])


def _storage(max_size: int | None = 8) -> ListStorage:
    storage = ListStorage(max_size)
    storage.set(range(5), list(ITEMS))
    return storage


def _state(storage: ListStorage) -> tuple[list, int | None, int]:
    return storage.items(), storage.last_written_row, len(storage)


@pytest.mark.parametrize("max_size", [5, 8, None])
def test_a_mask_reads_the_rows_it_marks(max_size):
    storage = _storage(max_size)
    assert storage.get(MASK) == ["a", "c", "e"]  # (TorchRL 0.14.1: rows 1, 0, 1, 0, 1)
    assert storage[MASK] == ["a", "c", "e"]
    assert storage.get(torch.zeros(5, dtype=torch.bool)) == []
    assert storage.get(torch.ones(5, dtype=torch.bool)) == ITEMS
    assert _state(storage) == (ITEMS, 4, 5)


def test_a_mask_of_every_slot_of_max_size_reads_as_the_tensor_storages_read_it():
    storage = _storage(8)
    mask = torch.tensor([False, True, False, True, False, False, False, False])
    assert storage.get(mask) == ["b", "d"]
    assert storage[mask] == ["b", "d"]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.booleans(), min_size=5, max_size=5))
def test_a_mask_reads_and_writes_as_torch_indexing(bits):
    mask = torch.tensor(bits, dtype=torch.bool)
    values = torch.arange(5) * 10
    storage = ListStorage(5)
    storage.set(range(5), values.tolist())
    assert storage.get(mask) == values[mask].tolist()
    new = -torch.arange(1, int(mask.sum()) + 1)
    storage.set(mask, new.tolist())
    values[mask] = new
    assert storage.items() == values.tolist()


@pytest.mark.parametrize("how", ["set", "setitem"])
def test_a_mask_writes_the_rows_it_marks_only(how):
    storage = _storage()
    mask = torch.tensor([True, False, True, False, False])
    if how == "set":
        storage.set(mask, ["A", "C"])
    else:
        storage[mask] = ["A", "C"]
    assert storage.items() == ["A", "b", "C", "d", "e"]
    assert len(storage) == 5
    # set writes at the writer's cursor (its last row); storage[mask] = ... is an edit
    assert storage.last_written_row == (2 if how == "set" else 4)


def test_set_with_a_mask_and_set_cursor_false_keeps_the_newest_row():
    storage = _storage()
    storage.set(torch.tensor([False, True, False, True, False]), ["B", "D"], set_cursor=False)
    assert storage.items() == ["a", "B", "c", "D", "e"] and storage.last_written_row == 4


def test_a_mask_of_every_slot_of_max_size_writes_as_the_tensor_storages_write():
    storage = _storage(8)
    storage.set(torch.tensor([True, False, False, False, True, False, False, False]), ["A", "E"])
    assert storage.items() == ["A", "b", "c", "d", "E"]


BAD_MASKS = {
    "short": (torch.tensor([True, False]), IndexError, r"shape \(2,\).*per written row \(5\)"),
    "long": (torch.ones(6, dtype=torch.bool), IndexError, r"shape \(6,\)"),
    "2-D": (MASK.reshape(5, 1), IndexError, r"shape \(5, 1\): it must be 1-D"),
    "0-D": (torch.tensor(True), IndexError, r"shape \(\)"),
    "unwritten": (
        torch.tensor([True] + [False] * 6 + [True]),
        IndexError,
        r"marks rows \[7\].*not written",
    ),
    "uint8": (MASK.to(torch.uint8), TypeError, "uint8"),
    "numpy uint8": (MASK.numpy().astype(np.uint8), TypeError, "uint8"),
    "numpy bool": (MASK.numpy(), TypeError, "must hold integers"),
    "float": (MASK.float(), TypeError, "float"),
}


@pytest.mark.parametrize("case", list(BAD_MASKS))
def test_a_bad_mask_is_refused_on_read_naming_index(case):
    mask, error, match = BAD_MASKS[case]
    storage = _storage(8)
    with pytest.raises(error, match=f"index.*{match}|{match}.*index"):
        storage.get(mask)
    with pytest.raises(error, match=match):
        storage[mask]  # noqa: B018
    assert _state(storage) == (ITEMS, 4, 5)


@pytest.mark.parametrize("case", list(BAD_MASKS))
def test_a_bad_mask_is_refused_on_write_naming_cursor_and_nothing_is_written(case):
    mask, error, match = BAD_MASKS[case]
    storage = _storage(8)
    with pytest.raises(error, match=f"cursor.*{match}|{match}.*cursor"):
        storage.set(mask, ["X", "Y", "Z"])
    assert _state(storage) == (ITEMS, 4, 5)
    with pytest.raises(error, match=match):
        storage[mask] = ["X", "Y", "Z"]
    assert _state(storage) == (ITEMS, 4, 5)


def test_a_mask_with_as_many_items_as_trues_only_is_taken():
    storage = _storage()
    with pytest.raises(ValueError, match="got 2 items for 3 rows"):
        storage.set(MASK, ["X", "Y"])
    with pytest.raises(ValueError, match="got 5 items for 3 rows"):
        storage.set(MASK, list("VWXYZ"))  # (TorchRL 0.14.1 wrote rows 1 and 0)
    assert _state(storage) == (ITEMS, 4, 5)


def test_int_rows_are_still_rows():
    storage = _storage()
    assert storage.get(torch.tensor([1, 0, 1])) == ["b", "a", "b"]
    assert storage.get(torch.tensor([1, 0], dtype=torch.int32)) == ["b", "a"]
    assert storage.get(np.array([4, -1])) == ["e", "e"]
    storage.set(torch.tensor([1, 0]), ["B", "A"])
    assert storage.items() == ["A", "B", "c", "d", "e"]
    assert storage.get(torch.tensor([], dtype=torch.uint8)) == []  # (selects nothing)


def _buffer() -> ReplayBuffer:
    rb = ReplayBuffer(storage=ListStorage(8), batch_size=2)
    rb.extend(torch.arange(5.0) * 10)
    return rb


def test_a_buffer_over_a_list_storage_reads_and_writes_a_mask():
    rb = _buffer()
    read = rb[MASK]
    assert read.dtype == torch.float32 and read.tolist() == [0.0, 20.0, 40.0]
    rb[MASK] = torch.tensor([-1.0, -2.0, -3.0])
    assert rb[:].tolist() == [-1.0, 10.0, -2.0, 30.0, -3.0]
    assert len(rb) == 5 and rb.write_count == 5


@pytest.mark.parametrize("case", list(BAD_MASKS))
def test_a_buffer_is_unchanged_after_a_refused_mask(case):
    mask, error, match = BAD_MASKS[case]
    rb = _buffer()
    before = buffer_snapshot(rb)
    with pytest.raises(error):
        rb[mask]  # noqa: B018
    with pytest.raises(error):
        rb[mask] = torch.tensor([-1.0, -2.0, -3.0])
    assert_same(buffer_snapshot(rb), before)
    assert rb[:].tolist() == [0.0, 10.0, 20.0, 30.0, 40.0]


def test_a_buffer_is_unchanged_after_a_mask_with_too_few_items():
    rb = _buffer()
    before = buffer_snapshot(rb)
    with pytest.raises(ValueError, match="items for 3 rows"):
        rb[MASK] = torch.tensor([-1.0, -2.0])
    assert_same(buffer_snapshot(rb), before)
