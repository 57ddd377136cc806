"""An empty slice (``rb[5:2]``, ``rb[4:4]``) assigned an empty batch writes nothing, as TorchRL
(``torch.arange`` refused a stop below the start with a bare torch error)."""

from __future__ import annotations

import pytest

from tdreplay.core import ListStorage, ReplayBuffer


@pytest.mark.parametrize("index", [slice(3, 1), slice(2, 2), slice(3, 1, 2)])
def test_an_empty_slice_of_a_list_buffer_writes_nothing(index):
    rb = ReplayBuffer(storage=ListStorage(10))
    rb.extend([1, 2, 3, 4])
    rb[index] = []
    assert rb[:] == [1, 2, 3, 4] and len(rb) == 4 and rb.write_count == 4
