"""``rb[i] = td`` / ``storage[i, j] = td`` of a multi-dim storage (an index of its dims, written
in place) refuses data with a key the storage lacks, or without any entry, naming the keys, as
a write of rows does: it dropped an unknown or extra key (nested too) without a word, and
took an empty TensorDict as written (TorchRL's does so too). (An extra key beside every
entry is added by a LazyTensorStorage, refused by a LazyMemmapStorage.)"""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage

STORAGES = {"lazy": lambda: LazyTensorStorage(12, ndim=2),
            "memmap": lambda: LazyMemmapStorage(12, ndim=2)}

CASES = {
    "unknown": ((0, 1), TensorDict({"y": torch.tensor(5.0)}, []), r"missing \['x'\], "
                r"unexpected \['y'\]"),
    "extra": ((0, 1), TensorDict({"x": torch.tensor(7.0), "y": torch.tensor(5.0)}, []),
              r"missing \[\], unexpected \['y'\]"),
    "row_unknown": (1, TensorDict({"y": torch.ones(2)}, [2]), r"missing .*x.*unexpected .*y"),
    "empty": ((0, 0), TensorDict({}, []), r"missing \['x'\], unexpected \[\]"),
    "nested_extra": (1, TensorDict({"x": torch.ones(2), "n": {"z": torch.ones(2)}}, [2]),
                     r"missing \[\], unexpected \[.*n.*z.*\]"),
}


@pytest.mark.parametrize("make", STORAGES.values(), ids=STORAGES.keys())
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_an_index_write_of_other_keys_is_refused_and_changes_nothing(make, case, request):
    index, value, names = case
    if make is STORAGES["lazy"] and "extra" in request.node.callspec.id:
        pytest.skip("a LazyTensorStorage adds a new entry (test_ndim2_new_entry.py)")
    rb = TensorDictReplayBuffer(storage=make())
    rb.extend(TensorDict({"x": torch.arange(6.0).reshape(3, 2)}, [3, 2]))
    with pytest.raises(KeyError, match=r"data keys do not match the storage: " + names):
        rb[index] = value
    out = rb[:]
    assert list(out.keys()) == ["x"] and out["x"].tolist() == [[0.0, 1.0], [2.0, 3.0],
                                                               [4.0, 5.0]]
    assert len(rb) == 6
