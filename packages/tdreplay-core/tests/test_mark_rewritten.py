"""``rb[i] = x`` tells the samplers ``mark_rewritten`` (``mark_update`` by default);
``default_priority`` and ``len_storage`` of the core samplers."""

from __future__ import annotations

import torch

from tdreplay.core import ListStorage, RandomSampler, ReplayBuffer, SamplerWithoutReplacement


class Recording(RandomSampler):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, list[int]]] = []

    def mark_update(self, slots: torch.Tensor) -> None:
        self.calls.append(("mark_update", slots.tolist()))


class Keeping(Recording):
    def mark_rewritten(self, slots: torch.Tensor) -> None:
        self.calls.append(("mark_rewritten", slots.tolist()))


def test_default_mark_rewritten_is_mark_update() -> None:
    rb = ReplayBuffer(storage=ListStorage(4), sampler=Recording())
    rb.extend(["a", "b", "c"])
    rb[1] = "B"
    rb.write_all(["x", "y"])
    assert rb.sampler.calls == [("mark_update", [1]), ("mark_update", [0, 1])]


def test_setitem_calls_mark_rewritten_not_mark_update() -> None:
    rb = ReplayBuffer(storage=ListStorage(4), sampler=Keeping())
    rb.extend(["a", "b", "c"])
    rb[1] = "B"
    rb.write_all(["x", "y"])
    rb.mark_update(2)  # an explicit mark_update stays one
    assert rb.sampler.calls == [("mark_rewritten", [1]), ("mark_rewritten", [0, 1]),
                                ("mark_update", [2])]
    assert rb[:] == ["x", "y", "c"]


def test_other_buffers_of_the_storage_hear_mark_rewritten() -> None:
    storage = ListStorage(4)
    first = ReplayBuffer(storage=storage, sampler=Keeping())
    second = ReplayBuffer(storage=storage, sampler=Keeping())
    first.extend(["a", "b"])
    first[0] = "A"
    assert first.sampler.calls == [("mark_rewritten", [0])]
    assert second.sampler.calls == [("mark_rewritten", [0])]


def test_default_priority_of_the_base_sampler() -> None:
    assert RandomSampler().default_priority == 1.0
    assert SamplerWithoutReplacement().default_priority == 1.0


def test_len_storage() -> None:
    storage, sampler = ListStorage(8), SamplerWithoutReplacement(shuffle=False)
    assert sampler.len_storage == 0
    storage.set(torch.arange(3), list("abc"))
    assert sampler.sample(storage, 2)[0].tolist() == [0, 1]
    assert sampler.len_storage == 3
    storage.set(torch.arange(3, 5), list("de"))
    assert sampler.sample(storage, 5)[0].tolist() == [0, 1, 2, 3, 4]
    assert sampler.len_storage == 5
    sampler.empty()
    assert sampler.len_storage == 0
