"""``Storage.flatten()`` (TorchRL's): 1-D storages return themselves, multi-dimensional tensor
storages a ``TensorStorage`` viewing their written slots, others raise."""

from __future__ import annotations

import pytest
import torch
from tensordict import NonTensorStack, TensorDict, tensorclass

from tdreplay.core import ListStorage, ReplayBuffer
from tdreplay.storages import (
    CompressedListStorage,
    LazyMemmapStorage,
    LazyStackStorage,
    LazyTensorStorage,
    TensorStorage,
)


@tensorclass
class Obs:
    pos: torch.Tensor


def steps(batch: int, time: int, start: float = 0.0) -> TensorDict:
    x = torch.arange(start, start + batch * time).reshape(batch, time)
    return TensorDict({"x": x, ("n", "y"): x.unsqueeze(-1) * 10}, [batch, time])


MULTI = {
    "lazy": lambda tmp: LazyTensorStorage(12, ndim=2),
    "memmap": lambda tmp: LazyMemmapStorage(12, ndim=2, scratch_dir=tmp / "scratch"),
    "shared": lambda tmp: LazyTensorStorage(12, ndim=2, shared_init=True),
}


@pytest.mark.parametrize("factory", [lambda: LazyTensorStorage(5), lambda: ListStorage(5),
                                     lambda: LazyStackStorage(5),
                                     lambda: CompressedListStorage(5),
                                     lambda: LazyMemmapStorage(5)])
def test_one_dimensional_storages_return_themselves(factory):
    storage = factory()
    assert storage.flatten() is storage


@pytest.mark.parametrize("kind", MULTI)
def test_partly_written_storage_flattens_its_written_rows(tmp_path, kind):
    storage = MULTI[kind](tmp_path)
    storage.set(slice(0, 2), steps(2, 4))
    flat = storage.flatten()
    assert type(flat) is TensorStorage
    assert flat.ndim == 1 and flat.max_size == 8 and len(flat) == 8
    assert flat.get(torch.arange(8))["x"].tolist() == list(map(float, range(8)))
    assert flat.get(torch.tensor([6]))["n", "y"].tolist() == [[60.0]]
    assert len(storage) == 8 and storage.shape == torch.Size([3, 4])  # the source is unchanged


@pytest.mark.parametrize("kind", MULTI)
def test_full_storage_flattens_every_row(tmp_path, kind):
    storage = MULTI[kind](tmp_path)
    storage.set(slice(0, 3), steps(3, 4))
    storage.set(slice(0, 1), steps(1, 4, start=100.0))  # wrapped over
    flat = storage.flatten()
    assert flat.max_size == 12 and len(flat) == 12
    assert flat.get(torch.arange(12))["x"].tolist() == [100.0, 101.0, 102.0, 103.0,
                                                        *map(float, range(4, 12))]


@pytest.mark.parametrize("kind", MULTI)
def test_flattened_storage_shares_memory_with_the_source(tmp_path, kind):
    storage = MULTI[kind](tmp_path)
    storage.set(slice(0, 2), steps(2, 4))
    flat = storage.flatten()
    flat.set(5, TensorDict({"x": torch.tensor(-5.0), ("n", "y"): torch.tensor([-50.0])}, []))
    assert storage[1]["x"].tolist() == [4.0, -5.0, 6.0, 7.0]
    storage.set(slice(0, 1), steps(1, 4, start=20.0))  # and the other way round
    assert flat.get(torch.arange(4))["x"].tolist() == [20.0, 21.0, 22.0, 23.0]


def test_flatten_keeps_the_kind_of_data():
    tensors = LazyTensorStorage(12, ndim=2)
    tensors.set(slice(0, 2), torch.arange(8).reshape(2, 4))
    assert tensors.flatten().get(torch.tensor([7, 0])).tolist() == [7, 0]
    classes = LazyTensorStorage(12, ndim=2)
    classes.set(slice(0, 1), TensorDict(o=Obs(pos=torch.ones(1, 4, 2), batch_size=[1, 4]),
                                        batch_size=[1, 4]))
    out = classes.flatten().get(torch.tensor([3]))
    assert type(out["o"]) is Obs and out["o"].pos.tolist() == [[1.0, 1.0]]
    trees = LazyTensorStorage(12, ndim=2)
    trees.set(slice(0, 1), {"a": torch.arange(4).reshape(1, 4)})
    assert trees.flatten().get(torch.tensor([2]))["a"].tolist() == [2]


def test_flatten_copies_non_tensor_entries():
    storage = LazyTensorStorage(12, ndim=2)
    words = NonTensorStack(*[NonTensorStack(*[f"{i}{j}" for j in range(4)]) for i in range(2)])
    storage.set(slice(0, 2), TensorDict({"a": torch.zeros(2, 4), "w": words}, [2, 4]))
    flat = storage.flatten()
    assert flat.get(torch.tensor([0, 5]))["w"] == ["00", "11"]


def test_wrapped_tensor_storage_flattens():
    storage = TensorStorage(TensorDict({"x": torch.arange(6).reshape(2, 3)}, [2, 3]), ndim=2)
    flat = storage.flatten()
    assert flat.max_size == 6 and flat.get(torch.arange(6))["x"].tolist() == list(range(6))


def test_a_buffer_over_the_flattened_storage_samples_its_slots():
    storage = LazyTensorStorage(12, ndim=2)
    storage.set(slice(0, 2), steps(2, 4))
    rb = ReplayBuffer(storage=storage.flatten(), batch_size=16)
    assert len(rb) == 8
    assert set(rb.sample()["x"].tolist()) <= set(map(float, range(8)))


@pytest.mark.parametrize("kind", MULTI)
def test_uninitialized_storage_refuses(tmp_path, kind):
    storage = MULTI[kind](tmp_path)
    with pytest.raises(RuntimeError, match="non-initialized"):
        storage.flatten()
    assert not storage.initialized


def test_emptied_storage_refuses():
    storage = LazyTensorStorage(12, ndim=2)
    storage.set(slice(0, 2), steps(2, 4))
    storage.empty()
    with pytest.raises(RuntimeError, match="without written rows"):
        storage.flatten()
    assert len(storage) == 0


def test_other_storages_with_several_dims_refuse():
    storage = ListStorage(4)
    storage.ndim = 2  # (no tdreplay list storage has ndim > 1: TorchRL's base refusal)
    with pytest.raises(RuntimeError, match="not supported for storages of type ListStorage"):
        storage.flatten()
