"""``ListStorage(device=...)`` (and ``LazyStackStorage``), as TorchRL's: written items are
moved to the device (a pytree's tensors) before they are stored; ``None`` stores them as
given."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ListStorage, ReplayBuffer


def test_items_are_moved_to_the_device_and_cast_nothing_else():
    storage = ListStorage(4, device="meta")  # (a device every machine has)
    storage.set(0, torch.ones(2))
    storage.set(slice(1, 3), [{"x": torch.zeros(3), "name": "a"}, (torch.ones(1), 7)])
    assert storage.get(0).device.type == "meta"
    assert storage.get(1)["x"].device.type == "meta" and storage.get(1)["name"] == "a"
    assert storage.get(2)[0].device.type == "meta" and storage.get(2)[1] == 7
    assert storage.device == torch.device("meta")


def test_a_buffer_over_it_stores_tensordicts_on_the_device():
    rb = ReplayBuffer(storage=ListStorage(4, device="meta"))
    rb.add(TensorDict({"x": torch.ones(2)}, []))
    rb.extend([TensorDict({"x": torch.zeros(2)}, [])])
    assert [item.device.type for item in rb.storage.items()] == ["meta", "meta"]


def test_without_a_device_items_are_stored_as_given():
    storage = ListStorage(2)
    item = torch.ones(1)
    storage.set(0, item)
    assert storage.get(0) is item and storage.device == torch.device("cpu")


def test_restored_items_go_to_the_device():
    saved = ListStorage(2)
    saved.set(slice(0, 2), [torch.ones(1), torch.zeros(1)])
    restored = ListStorage(2, device="meta")
    restored.load_state_dict(saved.state_dict())
    assert [item.device.type for item in restored.items()] == ["meta", "meta"]


def test_a_bad_device_is_refused_by_name():
    with pytest.raises(RuntimeError, match="device"):
        ListStorage(2, device="no-such-device")
