"""``rb[i] = x`` takes ``x`` shaped as ``rb[i]`` reads: a tensor or pytree at an index of an
``ndim=2`` storage (``rb[0, 1] = torch.tensor(5.)``, ``rb[1] = ...``: refused for lacking two
leading dims, TorchRL writes them), broadcast as torch's assignment broadcasts; data shaped
as a multi-dim tensor of rows reads (``rb[idx] = rb[idx]`` with ``idx`` of shape ``[2, 2]``:
refused as not of shape ``[4]``, TorchRL writes it)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ReplayBuffer, TensorDictReplayBuffer
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage

MAKERS = {"lazy": LazyTensorStorage, "memmap": LazyMemmapStorage}


@pytest.mark.parametrize("make", MAKERS.values(), ids=MAKERS.keys())
def test_tensors_write_where_they_read_in_a_two_dim_storage(make):
    rb = ReplayBuffer(storage=make(12, ndim=2))
    rb.extend(torch.arange(6.0).reshape(3, 2))
    rb[0, 1] = torch.tensor(5.0)
    rb[1] = torch.tensor([7.0, 8.0])
    rb[2] = torch.tensor(9.0)  # broadcast to both steps
    assert rb[:].tolist() == [[0.0, 5.0], [7.0, 8.0], [9.0, 9.0]]
    with pytest.raises(ValueError, match=r"value of shape \(3,\) for the data does not fit"):
        rb[0] = torch.ones(3)
    with pytest.raises(TypeError, match="this storage holds tensor data; got tensordict"):
        rb[0] = TensorDict({"a": torch.ones(2)}, [2])
    assert rb[:].tolist() == [[0.0, 5.0], [7.0, 8.0], [9.0, 9.0]]


@pytest.mark.parametrize("make", MAKERS.values(), ids=MAKERS.keys())
def test_pytrees_write_where_they_read_in_a_two_dim_storage(make):
    rb = ReplayBuffer(storage=make(12, ndim=2))
    rb.extend({"x": torch.arange(6.0).reshape(3, 2), "y": torch.zeros(3, 2, 2)})
    rb[0, 1] = {"x": torch.tensor(5.0), "y": torch.ones(2)}
    rb[1] = {"x": torch.tensor([7.0, 8.0]), "y": torch.full((2,), 3.0)}
    out = rb[:]
    assert out["x"].tolist() == [[0.0, 5.0], [7.0, 8.0], [4.0, 5.0]]
    assert out["y"][:, :, 0].tolist() == [[0.0, 1.0], [3.0, 3.0], [0.0, 0.0]]
    with pytest.raises(ValueError, match="pytree structure"):
        rb[0, 1] = {"x": torch.tensor(5.0)}
    assert rb[:]["x"].tolist() == [[0.0, 5.0], [7.0, 8.0], [4.0, 5.0]]


@pytest.mark.parametrize("make", MAKERS.values(), ids=MAKERS.keys())
def test_data_shaped_as_a_multi_dim_index_reads_is_written(make):
    rb = ReplayBuffer(storage=make(6))
    rb.extend(torch.arange(4.0) * 10)
    index = torch.tensor([[0, 1], [2, 0]])
    assert rb[index].shape == (2, 2)
    rb[index] = torch.tensor([[1.0, 2.0], [3.0, 4.0]])  # row 0 twice: as a 1-d index of it
    flat = ReplayBuffer(storage=LazyTensorStorage(6))
    flat.extend(torch.arange(4.0) * 10)
    flat[index.reshape(-1)] = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert rb[:].tolist() == flat[:].tolist()
    assert rb[:][1:].tolist() == [2.0, 3.0, 30.0]
    td = TensorDictReplayBuffer(storage=make(6))
    td.extend(TensorDict({"x": torch.arange(4.0), "y": torch.zeros(4, 3)}, [4]))
    back = td[index]
    back["x"] = back["x"] + 100
    td[index] = back
    assert td[:]["x"].tolist() == [100.0, 101.0, 102.0, 3.0]
    with pytest.raises(ValueError, match="expected"):  # neither [2, 2] nor [4]
        rb[index] = torch.ones(2, 3)
    assert rb[:][1:].tolist() == [2.0, 3.0, 30.0]
