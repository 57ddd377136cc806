"""Tests of ImmutableDatasetWriter: every write is refused and nothing changes."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ListStorage, TensorDictReplayBuffer
from tdreplay.writers import ImmutableDatasetWriter


def dataset_buffer() -> TensorDictReplayBuffer:
    storage = ListStorage(8)
    # a dataset arrives pre-filled through its storage, not through the writer
    storage.set(torch.arange(4), TensorDict({"obs": torch.arange(4.0)}, [4]))
    return TensorDictReplayBuffer(storage=storage, writer=ImmutableDatasetWriter(), batch_size=3)


@pytest.mark.parametrize("method", ["add", "extend"])
def test_writes_raise_and_change_nothing(method):
    rb = dataset_buffer()
    data = TensorDict({"obs": torch.tensor([9.0, 9.0])}, [2])
    if method == "add":
        data = data[0]
    with pytest.raises(RuntimeError, match="immutable dataset") as info:
        getattr(rb, method)(data)
    assert "ImmutableDatasetWriter" in str(info.value)
    assert len(rb) == 4 and rb.write_count == 0
    assert rb[:]["obs"].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert "index" not in data.keys()


def test_writer_refuses_even_when_called_directly():
    writer = ImmutableDatasetWriter()
    writer.register_storage(ListStorage(2))
    with pytest.raises(RuntimeError, match="Cannot extend an immutable dataset"):
        writer.extend([1, 2])
    with pytest.raises(RuntimeError, match="Cannot add to an immutable dataset"):
        writer.add(1)
    assert len(writer.storage) == 0


def test_reading_and_checkpointing_still_work(tmp_path):
    rb = dataset_buffer()
    sample = rb.sample()
    assert sample["obs"].shape == (3,)
    assert torch.equal(sample["obs"], sample["index"].float())
    rb.dumps(tmp_path / "ds")
    restored = TensorDictReplayBuffer(storage=ListStorage(8), writer=ImmutableDatasetWriter())
    restored.loads(tmp_path / "ds")
    assert restored[:]["obs"].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert restored.writer.state_dict() == {"write_count": 0}


def test_empty_is_refused_and_the_buffer_keeps_its_items():
    """As TorchRL's ("This dataset doesn't allow writing"): a dataset is not emptied either."""
    rb = dataset_buffer()
    with pytest.raises(RuntimeError, match="Cannot empty an immutable dataset"):
        rb.empty()
    with pytest.raises(RuntimeError, match="Cannot empty an immutable dataset"):
        rb.writer.empty()
    assert len(rb) == 4 and rb[:]["obs"].tolist() == [0.0, 1.0, 2.0, 3.0]
    # a buffer reading the same storage is not emptied either (its empty would empty both)
    # (the error says the refusal is another buffer's: the caller emptied a plain buffer)
    other = TensorDictReplayBuffer(storage=rb.storage, batch_size=2)
    with pytest.raises(RuntimeError, match=r"another buffer reading this buffer's storage "
                       r"\(TensorDictReplayBuffer with a ImmutableDatasetWriter\) refuses the "
                       r"empty: Cannot empty an immutable dataset"):
        other.empty()
    assert len(rb) == len(other) == 4


@pytest.mark.parametrize("edit", [
    lambda rb: rb.__setitem__(0, TensorDict({"obs": torch.tensor(9.0)}, [])),
    lambda rb: rb.write_all(TensorDict({"obs": torch.zeros(2)}, [2])),
    lambda rb: rb.set_("obs", torch.zeros(4)),
    lambda rb: rb.set_at_("obs", torch.tensor(9.0), 1),
    lambda rb: rb.update_(TensorDict({"obs": torch.zeros(4)}, [4])),
], ids=["setitem", "write_all", "set_", "set_at_", "update_"])
def test_in_place_edits_are_refused_and_change_nothing(edit):
    """A dataset's files are what later buffers read: an edit would persist there (TorchRL's
    datasets take it)."""
    rb = dataset_buffer()
    with pytest.raises(RuntimeError, match="Cannot edit an immutable dataset"):
        edit(rb)
    assert rb[:]["obs"].tolist() == [0.0, 1.0, 2.0, 3.0]
    other = TensorDictReplayBuffer(storage=rb.storage)  # (another buffer over the dataset)
    with pytest.raises(RuntimeError, match="another buffer .* refuses the edit: Cannot edit an "
                       "immutable dataset"):
        edit(other)
    assert rb[:]["obs"].tolist() == [0.0, 1.0, 2.0, 3.0]
