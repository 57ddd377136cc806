"""``storage.set`` at negative rows of a tensor storage that is not full counts them from the
written rows, as ``get(-1)``, ``rb[-1] = x`` and a list storage do. Before, ``set(-1, x)``
after 5 of 10 rows wrote row 9 and counted the 4 zero rows between as written (samples drew
them)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ListStorage
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage

STORAGES = [LazyTensorStorage, LazyMemmapStorage, ListStorage,
            lambda n: LazyTensorStorage(n, compilable=True)]


def five_of_ten(make):
    storage = make(10)
    storage.set(torch.arange(5), TensorDict({"v": torch.arange(5)}, [5]))
    return storage


def values(storage):
    return [int(storage.get(i)["v"]) for i in range(len(storage))]


@pytest.mark.parametrize("make", STORAGES)
@pytest.mark.parametrize(("cursor", "data", "expected"), [
    (-1, TensorDict({"v": torch.tensor(100)}, []), [0, 1, 2, 3, 100]),
    (torch.tensor([-1, -5]), TensorDict({"v": torch.tensor([100, 101])}, [2]),
     [101, 1, 2, 3, 100]),
    (slice(-2, None), TensorDict({"v": torch.tensor([100, 101])}, [2]), [0, 1, 2, 100, 101]),
])
def test_negative_rows_count_from_the_written_rows(make, cursor, data, expected):
    storage = five_of_ten(make)
    if isinstance(cursor, slice) and make is ListStorage:
        pytest.skip("a list storage sets a slice of rows as Python's list does")
    storage.set(cursor, data)
    assert len(storage) == 5
    assert values(storage) == expected


@pytest.mark.parametrize("make", [LazyTensorStorage, LazyMemmapStorage])
def test_a_negative_row_before_the_first_is_refused_and_nothing_changes(make):
    storage = five_of_ten(make)
    with pytest.raises(IndexError, match=r"cursor -6 is out of range: the storage holds 5"):
        storage.set(-6, TensorDict({"v": torch.tensor(100)}, []))
    with pytest.raises(IndexError, match=r"cursor -6 is out of range"):
        storage.set(torch.tensor([0, -6]), TensorDict({"v": torch.tensor([7, 8])}, [2]))
    assert len(storage) == 5 and values(storage) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("make", [LazyTensorStorage, LazyMemmapStorage])
def test_a_full_storage_counts_negative_rows_from_its_end(make):
    storage = make(4)
    storage.set(torch.arange(4), TensorDict({"v": torch.arange(4)}, [4]))
    storage.set(torch.tensor([-1]), TensorDict({"v": torch.tensor([9])}, [1]))
    assert values(storage) == [0, 1, 2, 9]
