"""One row read from a ``CompressedListStorage`` (``get(0)``, ``rb[0]``, a sample of one) has
leaves with memory of their own: they used to be views of one byte buffer as different dtypes,
which ``torch.save`` and pickle refuse ("Cannot save multiple tensors or storages that view the
same data as different types")."""

from __future__ import annotations

import io
import pickle

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ListStorage, ReplayBuffer, TensorDictReplayBuffer
from tdreplay.storages import CompressedListStorage


def _rows() -> TensorDict:
    gen = torch.Generator().manual_seed(0)
    return TensorDict({"obs": torch.randn(4, 3, generator=gen),
                       "action": torch.arange(8, dtype=torch.int16).reshape(4, 2),
                       "done": torch.tensor([True, False, True, False]),
                       ("next", "value"): torch.arange(4, dtype=torch.float64) - 1.5,
                       "half": torch.randn(4, 5, generator=gen).to(torch.bfloat16)}, [4])


def _own_memory(row: TensorDict) -> None:
    leaves = [row.get(key) for key in row.keys(True, True)]
    pointers = {leaf.untyped_storage().data_ptr() for leaf in leaves}
    assert len(pointers) == len(leaves)
    for leaf in leaves:
        assert leaf.untyped_storage().nbytes() == leaf.numel() * leaf.element_size()


def _saved_and_loaded(value):
    buffer = io.BytesIO()
    torch.save(value, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


@pytest.mark.parametrize("read", ["get", "getitem", "buffer_index", "sample"])
def test_one_row_saves_with_its_values_and_dtypes(read):
    rows = _rows()
    rb = TensorDictReplayBuffer(storage=CompressedListStorage(10), batch_size=1)
    rb.extend(rows)
    if read == "get":
        row, at = rb.storage.get(2), 2
    elif read == "getitem":
        row, at = rb.storage[2], 2
    elif read == "buffer_index":
        row, at = rb[2], 2
    else:
        row = rb.sample()
        assert row.batch_size == (1,)
        at = [int(row["index"][0])]  # (the slot sampled, as a batch of one)
        row = row.exclude("index")
    _own_memory(row)
    back = _saved_and_loaded(row.to_dict())
    assert set(back) == {"obs", "action", "done", "next", "half"}
    expected = rows[at]
    for key in row.keys(True, True):
        leaf = back[key] if isinstance(key, str) else back[key[0]][key[1]]
        assert leaf.dtype == rows.get(key).dtype
        assert torch.equal(leaf, row.get(key))
        assert torch.equal(leaf, expected.get(key))
    assert (_saved_and_loaded(row) == row).all()


def test_a_list_storage_holding_a_row_read_back_dumps_and_pickles(tmp_path):
    source = TensorDictReplayBuffer(storage=CompressedListStorage(10))
    source.extend(_rows())
    target = ReplayBuffer(storage=ListStorage(10))
    target.add(source[1])
    target.dumps(tmp_path / "rb")
    restored = ReplayBuffer(storage=ListStorage(10))
    restored.loads(tmp_path / "rb")
    assert (restored[0] == _rows()[1]).all()
    copy = pickle.loads(pickle.dumps(target))
    assert (copy[0] == _rows()[1]).all()
    assert copy[0]["action"].dtype == torch.int16


def test_one_row_of_a_dict_and_of_a_tensor():
    storage = CompressedListStorage(4)
    storage.set(0, {"a": torch.tensor([1.5, -2.0]), "b": torch.tensor([7], dtype=torch.uint8)})
    storage.set(1, torch.tensor([[1, 2], [3, 4]], dtype=torch.int32))
    row = storage.get(0)
    assert row["a"].tolist() == [1.5, -2.0] and row["b"].dtype == torch.uint8
    assert row["a"].untyped_storage().data_ptr() != row["b"].untyped_storage().data_ptr()
    back = _saved_and_loaded(row)
    assert back["a"].tolist() == [1.5, -2.0] and back["b"].tolist() == [7]
    assert _saved_and_loaded(storage.get(1)).tolist() == [[1, 2], [3, 4]]
    row["a"][0] = 9.0  # memory of its own: writing to one leaf leaves the other alone
    assert row["b"].tolist() == [7] and storage.get(0)["a"].tolist() == [1.5, -2.0]
