"""A storage whose ``set`` overrides its base's (and calls it) advances its revision once per
call: only the outermost wrapped method bumps it."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage


def _row(value: float) -> TensorDict:
    return TensorDict({"x": torch.tensor([value])}, [1])


def test_memmap_set_advances_revision_once(tmp_path):
    storage = LazyMemmapStorage(8, scratch_dir=tmp_path)
    storage.set(slice(0, 1), _row(1.0))
    before = storage.revision
    storage.set(slice(1, 2), _row(2.0))
    assert storage.revision == before + 1
    assert storage.get(torch.tensor([1]))["x"].tolist() == [2.0]


def test_tensor_storage_set_advances_revision_once_and_after_a_refused_write():
    storage = LazyTensorStorage(8)
    storage.set(slice(0, 2), TensorDict({"x": torch.zeros(2)}, [2]))
    before = storage.revision
    storage.set(slice(0, 2), TensorDict({"x": torch.ones(2)}, [2]))
    assert storage.revision == before + 1
    try:
        storage.set(slice(0, 2), TensorDict({"y": torch.ones(2)}, [2]))
    except KeyError:
        pass
    assert storage.revision == before + 2  # a refused write advances it too (observers re-read)


def test_install_of_a_tensor_storage_advances_the_revision() -> None:
    """``install`` comes from a mixin of the tensor storages (what checkpointers use)."""
    source = LazyTensorStorage(4)
    source.set(torch.arange(2), TensorDict({"x": torch.arange(2.0)}, [2]))
    target = LazyTensorStorage(4)
    before = target.revision
    target.install(source.layout_meta(), source.written_rows().clone())
    assert target.revision == before + 1
    assert target.get(torch.arange(2))["x"].tolist() == [0.0, 1.0]
