"""``copy.deepcopy`` of a memory-mapped storage (or of a buffer holding one) copies the data
into files of its own, as TorchRL's copy is independent; pickling, what another process
receives, still maps the same files. The copy shared the files before: its writes changed the
original's rows and length."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage

STORAGES = {
    "memmap": lambda: LazyMemmapStorage(8),
    "shared_init": lambda: LazyTensorStorage(8, shared_init=True),
}


def _rows(values) -> TensorDict:
    values = torch.as_tensor(values, dtype=torch.float32)
    return TensorDict({"x": values, "n": {"y": values * 10}}, [len(values)])


@pytest.mark.parametrize("make", STORAGES.values(), ids=STORAGES.keys())
def test_a_deep_copied_buffer_writes_into_its_own_files(make):
    rb = TensorDictReplayBuffer(storage=make())
    rb.extend(_rows(range(6)))
    rb.extend(_rows([6, 7, 8]))  # wraps: the cursor is at row 1
    copied = copy.deepcopy(rb)
    assert copied.storage.scratch_dir != rb.storage.scratch_dir
    assert copied[:]["x"].tolist() == rb[:]["x"].tolist() == [8, 1, 2, 3, 4, 5, 6, 7]
    assert copied.writer.cursor == rb.writer.cursor == 1
    assert copied.write_count == rb.write_count == 9
    copied.extend(_rows([90, 91]))  # where the original would write next: rows 1 and 2
    copied[0] = _rows([99])[0]
    assert copied[:]["x"].tolist() == [99, 90, 91, 3, 4, 5, 6, 7]
    assert copied[:]["n", "y"].tolist() == [990, 900, 910, 30, 40, 50, 60, 70]
    assert rb[:]["x"].tolist() == [8, 1, 2, 3, 4, 5, 6, 7]  # the original is as it was
    assert rb.writer.cursor == 1 and rb.write_count == 9 and len(rb) == 8
    rb.extend(_rows([50]))
    assert copied[:]["x"].tolist()[1] == 90  # and the copy does not see its writes


@pytest.mark.parametrize("make", STORAGES.values(), ids=STORAGES.keys())
def test_an_empty_storage_copies_and_pickles_still_share(make):
    storage = make()
    copied = copy.deepcopy(storage)
    copied.set(torch.arange(2), _rows([1, 2]))
    assert len(copied) == 2 and len(storage) == 0
    storage.set(torch.arange(3), _rows([1, 2, 3]))
    same_files = pickle.loads(pickle.dumps(storage))  # what another process receives
    same_files.set(torch.tensor([3]), _rows([4]))
    assert len(storage) == 4 and storage[:]["x"].tolist() == [1, 2, 3, 4]


@pytest.mark.parametrize("make", STORAGES.values(), ids=STORAGES.keys())
def test_a_deep_copy_keeps_the_write_generations(make):
    """Without them, the copy's samples carried generation -1 and every ``update_if_present``
    through the copy was skipped as stale."""
    from tdreplay.core import RoundRobinWriter

    rb = TensorDictReplayBuffer(storage=make(), writer=RoundRobinWriter(track_generations=True))
    rb.extend(_rows(range(10)))  # wraps: rows 0 and 1 are in their second generation
    copied = copy.deepcopy(rb)
    slots = torch.arange(8)
    assert copied.writer.generations_of(slots).tolist() == [1, 1, 0, 0, 0, 0, 0, 0]
    result = copied.update_if_present(index=slots[:3], generation=rb.writer.generations_of(
        slots[:3]), patch={"x": torch.full((3,), -1.0)})
    assert result.updated.tolist() == [True, True, True]
    assert copied[:3]["x"].tolist() == [-1.0, -1.0, -1.0]
    assert rb[:3]["x"].tolist() == [8.0, 9.0, 2.0]  # the original is its own
    copied.extend(_rows([50]))  # the copy's stamps advance on their own
    assert copied.writer.generations_of(slots[2:3]).tolist() == [1]
    assert rb.writer.generations_of(slots[2:3]).tolist() == [0]
