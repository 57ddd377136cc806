"""``Storage.last_written_row``: the ring's newest row, where slice samplers, HER, ``Sequence``
sample units and ``rb.query`` cut trajectories. The writer's writes move it; an in-place edit
does not; a restored buffer and every handle of a shared storage see the writer's."""

from __future__ import annotations

import pickle

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ListStorage, ReplayBuffer
from tdreplay.storages import CompressedListStorage, LazyMemmapStorage, LazyTensorStorage

STORAGES = {
    "list": lambda: ListStorage(6),
    "compressed": lambda: CompressedListStorage(6),
    "lazy": lambda: LazyTensorStorage(6),
    "memmap": lambda: LazyMemmapStorage(6),
    "shared_init": lambda: LazyTensorStorage(6, shared_init=True),
}


def _rows(start: int, n: int) -> TensorDict:
    return TensorDict({"t": torch.arange(start, start + n)}, [n])


def _extend(rb: ReplayBuffer, data: TensorDict) -> None:
    rb.extend(list(data.unbind(0)) if isinstance(rb.storage, ListStorage) else data)


@pytest.mark.parametrize("name", sorted(STORAGES))
def test_the_writer_moves_it_and_an_in_place_edit_does_not(name):
    rb = ReplayBuffer(storage=STORAGES[name]())
    assert rb.storage.last_written_row is None
    _extend(rb, _rows(0, 8))  # 8 rows in 6: the newest is row 1
    assert rb.storage.last_written_row == 1
    rb[4] = _rows(100, 1)[0]  # rewrites a row: the ring's newest stays row 1
    assert rb.storage.last_written_row == 1
    rb.storage.set(3, _rows(200, 1)[0], set_cursor=False)
    assert rb.storage.last_written_row == 1
    rb.add(_rows(9, 1)[0])
    assert rb.storage.last_written_row == 2
    rb.empty()
    assert rb.storage.last_written_row is None


@pytest.mark.parametrize("how", ["state_dict", "dumps"])
@pytest.mark.parametrize("name", sorted(STORAGES))
def test_a_restored_buffer_knows_the_newest_row(tmp_path, name, how):
    # the storage's state does not hold it: the round-robin writer's cursor says it on load
    rb = ReplayBuffer(storage=STORAGES[name]())
    _extend(rb, _rows(0, 9))
    restored = ReplayBuffer(storage=STORAGES[name]())
    if how == "state_dict":
        restored.load_state_dict(rb.state_dict())
    else:
        rb.dumps(tmp_path)
        restored.loads(tmp_path)
    assert restored.storage.last_written_row == rb.storage.last_written_row == 2


@pytest.mark.parametrize("name", ["memmap", "shared_init"])
def test_every_handle_of_a_shared_storage_sees_the_newest_row(name):
    rb = ReplayBuffer(storage=STORAGES[name]())
    rb.extend(_rows(0, 6))
    other = pickle.loads(pickle.dumps(rb))  # another handle of the same files
    other.extend(_rows(6, 2))
    assert rb.storage.last_written_row == other.storage.last_written_row == 1
    rb[5] = _rows(100, 1)[0]
    assert other.storage.last_written_row == 1
