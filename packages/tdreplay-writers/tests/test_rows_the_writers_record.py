"""What the writers record of the rows they write, on storages of every kind: the generation of
a row named by coordinates, tensorclass rows, a batch that ranks too low, and the newest row of
a memory-mapped storage."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict, tensorclass

from tdreplay.core import ReplayBuffer, RoundRobinWriter, TensorDictReplayBuffer
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage
from tdreplay.writers import TensorDictMaxValueWriter, TensorDictRoundRobinWriter


def test_generations_of_coordinates_read_the_row_they_name():
    # the first component names the row of an ndim=2 storage; it was divided by the row's
    # number of steps as if a flat slot, so row 1 was read as row 0 ([3, 3, 2])
    rb = ReplayBuffer(storage=LazyTensorStorage(6, ndim=2),
                      writer=RoundRobinWriter(track_generations=True))
    rb.extend(TensorDict({"x": torch.arange(6.0).reshape(2, 3)}, [2, 3]))
    rb.extend(TensorDict({"x": torch.arange(12.0).reshape(2, 6)}, [2, 6]))  # rows 0-2 twice
    rb.extend(TensorDict({"x": torch.full((2, 1), 100.0)}, [2, 1]))  # row 0 only
    rows = torch.tensor([0, 1, 2])
    by_slot = rb.writer.generations_of(rows * 2)  # (flat slots: 2 steps per row)
    assert by_slot.tolist() == [3, 2, 2]
    assert rb.writer.generations_of((rows, torch.zeros(3, dtype=torch.long))).tolist() == \
        [3, 2, 2]


@tensorclass
class _Step:
    x: torch.Tensor


@pytest.mark.parametrize("buffer", [ReplayBuffer, TensorDictReplayBuffer])
def test_tensorclass_rows_are_written_without_an_index_field(buffer):
    # it raised "Cannot set the attribute 'index': _Step has no such field"; TorchRL's writer
    # writes a tensorclass as it is
    rb = buffer(storage=LazyTensorStorage(4), writer=TensorDictRoundRobinWriter())
    assert rb.extend(_Step(x=torch.arange(3.0), batch_size=[3])).tolist() == [0, 1, 2]
    assert rb.add(_Step(x=torch.tensor(7.0), batch_size=[])) == 3
    stored = rb[:]
    assert isinstance(stored, _Step)
    assert stored.x.tolist() == [0.0, 1.0, 2.0, 7.0]
    assert rb.writer.cursor == 0 and rb.writer.write_count == 4


def test_a_batch_ranked_too_low_adds_no_entry_to_the_storage():
    # nothing was written ([-1, -1]) but the storage grew a zero-filled "extra" column
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(4),
                                writer=TensorDictMaxValueWriter(rank_key="r"))
    rb.extend(TensorDict({"r": torch.full((4,), 5.0), "obs": torch.arange(4)}, [4]))
    low = TensorDict({"r": torch.ones(2), "obs": torch.arange(2), "extra": torch.zeros(2)}, [2])
    assert rb.extend(low).tolist() == [-1, -1]
    assert sorted(rb[:].keys()) == ["obs", "r"]
    with pytest.raises(KeyError, match="obs"):  # a known entry missing: still refused
        rb.extend(low.exclude("obs"))
    kept = TensorDict({"r": torch.full((1,), 9.0), "obs": torch.arange(1),
                       "extra": torch.ones(1)}, [1])
    assert rb.extend(kept).numel() == 1  # ranked high enough: the entry is added
    assert "extra" in rb[:].keys()


def test_a_memmap_storage_records_the_newest_row_of_any_writer(tmp_path):
    # its newest row followed the shared round-robin cursor, which a max-value writer never
    # moves (row 7, never written, was saved), and ignored direct set(set_cursor=True) calls
    def ranked(storage):
        rb = TensorDictReplayBuffer(storage=storage,
                                    writer=TensorDictMaxValueWriter(rank_key="r"))
        rb.extend(TensorDict({"r": torch.arange(6.0), "obs": torch.arange(6)}, [6]))
        return rb

    mapped = ranked(LazyMemmapStorage(8, scratch_dir=tmp_path / "a"))
    in_memory = ranked(LazyTensorStorage(8))
    assert mapped.storage.last_written_row == in_memory.storage.last_written_row == 5
    assert mapped.state_dict()["_last_written_row"] == 5
    for storage in (LazyTensorStorage(5), LazyMemmapStorage(5, scratch_dir=tmp_path / "b")):
        rb = ReplayBuffer(storage=storage)
        rb.extend(torch.arange(3))
        storage.set(torch.tensor([1]), torch.tensor([51]), set_cursor=True)
        assert storage.last_written_row == 1
        storage.set(slice(1, 3), torch.tensor([61, 62]), set_cursor=True)
        assert storage.last_written_row == 2
        storage.set(torch.tensor([0]), torch.tensor([70]), set_cursor=False)  # (an edit)
        assert storage.last_written_row == 2
        rb.empty()
        assert storage.last_written_row is None
    reopened = LazyMemmapStorage(8, scratch_dir=tmp_path / "a", existsok=True)
    assert len(reopened) == 6 and reopened.last_written_row == 5  # (another process's view)
