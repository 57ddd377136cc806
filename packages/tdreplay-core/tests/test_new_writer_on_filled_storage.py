"""A new buffer over a storage that already holds rows (restored alone, ``storage.loads(path)``
or ``load_state_dict``, as TorchRL programs do; or filled by another buffer): its writer began
at row 0, so the first writes replaced the ring's newest rows (or rows of a storage not full,
where free slots were left) while the oldest stayed. It goes on after the newest row."""

from __future__ import annotations

import pytest
import torch

from tdreplay.core import ListStorage, ReplayBuffer


def test_a_new_buffer_over_a_restored_ring_replaces_its_oldest_rows():
    source = ReplayBuffer(storage=ListStorage(4))
    source.extend([0, 1, 2, 3, 4, 5])  # the ring holds [4, 5, 2, 3]: row 1 is the newest
    storage = ListStorage(4)
    storage.load_state_dict(source.storage.state_dict())
    rb = ReplayBuffer(storage=storage)
    rb.extend([6])
    assert list(rb.storage) == [4, 5, 6, 3]  # 2, the oldest, was replaced (not 4, the newest)


def test_a_new_buffer_over_a_storage_not_full_appends():
    storage = ListStorage(8)
    storage.load_state_dict({"storage": [0, 1, 2], "max_size": 8})
    rb = ReplayBuffer(storage=storage)
    rb.extend([3, 4])
    assert list(rb.storage) == [0, 1, 2, 3, 4]


def test_a_second_buffer_of_a_storage_goes_on_after_the_first_ones_rows():
    first = ReplayBuffer(storage=ListStorage(4))
    first.extend([0, 1, 2, 3, 4])  # newest row 0
    second = ReplayBuffer(storage=first.storage)
    second.extend([5])
    assert list(first.storage) == [4, 5, 2, 3]


@pytest.mark.parametrize("kind", ["LazyTensorStorage", "LazyMemmapStorage"])
def test_a_tensor_storage_loaded_alone_from_its_checkpoint(kind, tmp_path):
    storages = pytest.importorskip("tdreplay.storages")
    source = ReplayBuffer(storage=getattr(storages, kind)(5))
    source.extend(torch.arange(8))  # [5, 6, 7, 3, 4]: row 2 is the newest
    source.storage.dumps(tmp_path / "storage")
    storage = getattr(storages, kind)(5)
    storage.loads(tmp_path / "storage")
    rb = ReplayBuffer(storage=storage)
    rb.extend(torch.tensor([8, 9]))
    assert rb.storage.get(torch.arange(5)).tolist() == [5, 6, 7, 8, 9]


@pytest.mark.parametrize("how", ["set_storage", "set_writer"])
def test_a_used_writer_given_a_restored_ring_replaces_its_oldest_rows(how):
    # the writer's cursor from its former storage (1) fitted in the rows, and was kept: the
    # write replaced 5, the newest row, instead of 2, the oldest
    source = ReplayBuffer(storage=ListStorage(4))
    source.extend([0, 1, 2, 3, 4, 5])  # [4, 5, 2, 3]: row 1 is the newest
    storage = ListStorage(4)
    storage.load_state_dict(source.storage.state_dict())
    used = ReplayBuffer(storage=ListStorage(4))
    used.extend([100])  # its writer's cursor: 1
    if how == "set_storage":
        used.set_storage(storage)
        rb = used
    else:
        rb = ReplayBuffer(storage=storage)
        rb.set_writer(used.writer)
    rb.extend([9])
    assert list(rb.storage) == [4, 5, 9, 3]
