"""``Storage.revision``: the mutating methods of any subclass advance it without code."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tdreplay.core import ListStorage, ReplayBuffer, RevisionTracking, Storage


class _DictStorage(Storage):
    """A third-party storage that knows nothing of revisions."""

    def __init__(self, max_size: int) -> None:
        super().__init__(max_size)
        self.items: dict[int, Any] = {}

    def set(self, rows: Any, data: Any, *, set_cursor: bool = True) -> None:
        rows = [int(rows)] if isinstance(rows, int) else torch.as_tensor(rows).tolist()
        data = [data] if len(rows) == 1 and not isinstance(data, list) else data
        if len(rows) != len(data):
            raise ValueError("rows and data differ in length")
        self.items.update(zip(rows, data))

    def get(self, slots: Any) -> Any:
        return [self.items[int(s)] for s in torch.as_tensor(slots).reshape(-1)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: Any) -> Any:
        return self.get(index)

    def empty(self) -> None:
        self.items = {}

    def state_dict(self) -> dict[str, Any]:
        return {"items": dict(self.items)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.items = dict(state_dict["items"])


class _Subclass(ListStorage):
    def set(self, rows: Any, data: Any, *, set_cursor: bool = True) -> None:
        super().set(rows, data)


def test_a_third_party_storage_gets_the_revision_for_free() -> None:
    storage = _DictStorage(4)
    assert isinstance(storage, RevisionTracking)
    seen = [storage.revision]
    storage.set(0, "a")
    seen.append(storage.revision)
    storage.set(0, "b")  # same length
    seen.append(storage.revision)
    storage.set(1, "c")
    seen.append(storage.revision)
    storage[1] = "d"  # the base __setitem__ goes through set
    seen.append(storage.revision)
    state = storage.state_dict()
    storage.empty()
    seen.append(storage.revision)
    storage.load_state_dict(state)
    seen.append(storage.revision)
    assert len(set(seen)) == len(seen) and storage.get(torch.tensor([0, 1])) == ["b", "d"]


def test_a_refused_write_advances_the_revision_and_changes_nothing() -> None:
    storage = _DictStorage(4)
    storage.set(0, "a")
    before = storage.revision
    with pytest.raises(ValueError):
        storage.set(torch.tensor([1, 2]), ["x"])
    assert storage.revision != before and storage.items == {0: "a"}


def test_buffer_writes_and_edits_advance_a_subclass_revision() -> None:
    storage = _Subclass(3)
    rb = ReplayBuffer(storage=storage, batch_size=1)
    seen = [storage.revision]
    rb.extend([1, 2, 3])
    seen.append(storage.revision)
    rb.extend([4])  # full ring: same length, slot 0 overwritten
    seen.append(storage.revision)
    rb[1] = 5
    seen.append(storage.revision)
    rb.empty()
    seen.append(storage.revision)
    assert len(set(seen)) == len(seen) and len(storage) == 0


def test_revision_is_per_storage() -> None:
    first, second = ListStorage(2), ListStorage(2)
    first.set(0, "a")
    assert first.revision != second.revision == 0


class _ClearMixin:
    """A mixin (no storage) that gives a storage its ``empty``."""

    def empty(self) -> None:
        self.items = {}  # type: ignore[attr-defined]


class _MixedStorage(_ClearMixin, _DictStorage):
    pass


def test_a_mutating_method_taken_from_a_mixin_advances_the_revision() -> None:
    storage = _MixedStorage(4)
    storage.set(0, "a")
    before = storage.revision
    storage.empty()
    assert storage.revision == before + 1 and len(storage) == 0
    storage.set(0, "b")
    assert storage.revision == before + 2

