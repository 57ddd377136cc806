"""``Storage.revision`` advances on every operation that changes what a storage holds, for every
storage kind, and a memory-mapped storage's revision is shared by whoever maps its files."""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ListStorage, ReplayBuffer, Storage
from tdreplay.storages import (
    CompressedListStorage,
    LazyMemmapStorage,
    LazyStackStorage,
    LazyTensorStorage,
    TensorStorage,
)


def _rows(n: int, start: int = 0) -> TensorDict:
    return TensorDict({"obs": torch.arange(start, start + n, dtype=torch.float32),
                       "id": torch.arange(start, start + n)}, [n])


FACTORIES: dict[str, Callable[[], Storage]] = {
    "list": lambda: ListStorage(8),
    "lazy_stack": lambda: LazyStackStorage(8),
    "compressed": lambda: CompressedListStorage(8),
    "tensor": lambda: TensorStorage(_rows(8) * 0),
    "lazy_tensor": lambda: LazyTensorStorage(8),
    "memmap": lambda: LazyMemmapStorage(8),
    "shared_lazy_tensor": lambda: LazyTensorStorage(8, shared_init=True),
}
TENSOR_KINDS = ("tensor", "lazy_tensor", "memmap", "shared_lazy_tensor")


def _advances(storage: Storage, op: Callable[[], Any]) -> None:
    before = storage.revision
    op()
    assert storage.revision != before


@pytest.mark.parametrize("kind", sorted(FACTORIES))
def test_every_mutation_advances_the_revision(kind: str, tmp_path: Path) -> None:
    storage = FACTORIES[kind]()
    assert isinstance(storage.revision, int)
    _advances(storage, lambda: storage.set(torch.arange(4), _rows(4)))
    _advances(storage, lambda: storage.set(0, _rows(1, start=20)[0]))  # same length
    assert len(storage) == (8 if kind == "tensor" else 4)
    _advances(storage, lambda: storage.__setitem__(1, _rows(1, start=30)[0]))
    state = storage.state_dict()
    storage.dumps(tmp_path / "ckpt")
    _advances(storage, storage.empty)
    assert len(storage) == 0
    _advances(storage, lambda: storage.load_state_dict(state))
    _advances(storage, lambda: storage.loads(tmp_path / "ckpt"))
    assert storage[1]["id"].tolist() == 30  # the restored data
    if kind in TENSOR_KINDS:
        _advances(storage, lambda: storage.set_key("obs", torch.tensor(-1.0), index=0))
        _advances(storage, lambda: storage.update_(storage[:].apply(lambda x: x + 1)))
        _advances(storage, lambda: storage.__setitem__((slice(0, 2),), _rows(2, start=50)))
        assert storage[0]["id"].item() == 50
    else:
        assert isinstance(storage, ListStorage)
        _advances(storage, lambda: storage.replace_items(storage.items()[:2]))
    _advances(storage, storage.bump_revision)


def test_writes_through_a_buffer_advance_the_revision() -> None:
    storage = LazyTensorStorage(4)
    rb = ReplayBuffer(storage=storage, batch_size=2)
    revisions = [storage.revision]
    rb.extend(_rows(4))
    revisions.append(storage.revision)
    rb.extend(_rows(2, start=10))  # wraps round: same length
    revisions.append(storage.revision)
    rb[0] = _rows(1, start=99)[0]
    revisions.append(storage.revision)
    assert len(set(revisions)) == 4 and len(storage) == 4


def test_memmap_revision_is_shared_by_storages_mapping_the_same_files(tmp_path: Path) -> None:
    first = LazyMemmapStorage(8, scratch_dir=tmp_path)
    first.set(torch.arange(4), _rows(4))
    second = LazyMemmapStorage(8, scratch_dir=tmp_path, existsok=True)
    assert second.revision == first.revision
    before = second.revision
    first.set(0, _rows(1, start=7)[0])  # same length
    assert second.revision == first.revision != before
    second.empty()
    assert first.revision == second.revision


def _overwrite(storage: LazyMemmapStorage) -> None:
    storage.set(0, _rows(1, start=42)[0])


def test_memmap_revision_sees_a_write_of_another_process() -> None:
    storage = LazyMemmapStorage(8)
    storage.set(torch.arange(4), _rows(4))
    before = storage.revision
    child = mp.get_context("fork").Process(target=_overwrite, args=(storage,))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    assert storage.revision != before
    assert storage[0]["id"].item() == 42
