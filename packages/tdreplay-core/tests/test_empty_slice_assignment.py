"""An empty slice (``rb[5:2]``, ``rb[4:4]``) assigned an empty batch writes nothing, as TorchRL
(``torch.arange`` refused a stop below the start with a bare torch error)."""

from __future__ import annotations

import pytest
import torch

from tdreplay.core import ListStorage, ReplayBuffer


@pytest.mark.parametrize("index", [slice(3, 1), slice(2, 2), slice(3, 1, 2)])
def test_an_empty_slice_of_a_list_buffer_writes_nothing(index):
    rb = ReplayBuffer(storage=ListStorage(10))
    rb.extend([1, 2, 3, 4])
    rb[index] = []
    assert rb[:] == [1, 2, 3, 4] and len(rb) == 4 and rb.write_count == 4


def test_list_storage_set_counts_negative_rows_from_the_last_written_item():
    # (refused with "rows [-2] out of range"; TorchRL's list, and rb[-2] = x, write item 0)
    from tdreplay.core import StorageIndexError

    storage = ListStorage(4)
    storage.set(torch.arange(2), ["a", "b"])
    storage.set(-2, "A")
    storage.set(torch.tensor([-1]), ["B"])
    assert storage[:] == ["A", "B"] and len(storage) == 2
    with pytest.raises(StorageIndexError, match=r"rows \[-3\] out of range .* holding 2 items"):
        storage.set(-3, "x")
    assert storage[:] == ["A", "B"]
