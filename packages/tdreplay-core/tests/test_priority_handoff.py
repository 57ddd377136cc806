"""A TensorDict buffer checks the priorities a batch brings before writing it, and then updates
the sampler with what ``Sampler.check_priority`` returned (a sampler may hand itself converted
values); ``None``, what samplers written for an earlier tdreplay return, stands for the values."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ListStorage, RandomSampler, Storage, TensorDictReplayBuffer


class RecordingSampler(RandomSampler):
    """A prioritized stand-in: ``check_priority`` returns ``returned(priority)``; updates are
    recorded."""

    is_prioritized = True

    def __init__(self, returned: Any) -> None:
        super().__init__()
        self.returned = returned
        self.checked: list[torch.Tensor] = []
        self.updates: list[tuple[list[int], Any]] = []

    def check_priority(self, priority: Any) -> Any:
        if bool((torch.as_tensor(priority) < 0).any()):
            raise ValueError("priority must be >= 0")
        self.checked.append(priority)
        return self.returned(priority)

    def update_priority(self, index: Any, priority: Any, *,
                        storage: Storage | None = None) -> None:
        self.updates.append((torch.as_tensor(index).tolist(), priority))


def batch(errors: list[float]) -> TensorDict:
    n = len(errors)
    return TensorDict({"obs": torch.arange(n, dtype=torch.float32),
                       "td_error": torch.tensor(errors)}, [n])


def test_the_update_gets_what_the_check_returned() -> None:
    sampler = RecordingSampler(lambda p: ("converted", p.double()))
    rb = TensorDictReplayBuffer(storage=ListStorage(8), sampler=sampler)
    rb.extend(batch([0.5, 2.0, 1.0]))
    [(index, handed)] = sampler.updates
    assert index == [0, 1, 2]
    assert handed[0] == "converted"
    assert handed[1].dtype == torch.float64 and handed[1].tolist() == [0.5, 2.0, 1.0]


def test_a_check_returning_none_updates_with_the_values_given() -> None:
    sampler = RecordingSampler(lambda p: None)
    rb = TensorDictReplayBuffer(storage=ListStorage(8), sampler=sampler)
    rb.extend(batch([3.0, 4.0]))
    [(index, handed)] = sampler.updates
    assert index == [0, 1]
    assert handed is sampler.checked[0]
    assert handed.tolist() == [3.0, 4.0]


def test_a_refused_check_writes_nothing() -> None:
    sampler = RecordingSampler(lambda p: p)
    rb = TensorDictReplayBuffer(storage=ListStorage(8), sampler=sampler)
    rb.extend(batch([1.0]))
    with pytest.raises(ValueError, match="priority"):
        rb.extend(batch([1.0, -1.0]))
    assert len(rb) == 1 and rb.writer.write_count == 1
    assert len(sampler.updates) == 1


def test_the_base_sampler_returns_the_values_themselves() -> None:
    values = torch.tensor([1.0, 2.0])
    assert RandomSampler().check_priority(values) is values


class OneCallSampler(RecordingSampler):
    """Records ``extend`` and ``extend_with_priority`` too."""

    def __init__(self) -> None:
        super().__init__(lambda p: ("checked", p))
        self.calls: list[tuple[str, list[int]]] = []

    def extend(self, slots: torch.Tensor) -> None:
        self.calls.append(("extend", slots.tolist()))

    def extend_with_priority(self, slots: torch.Tensor, priority: Any, *,
                             storage: Storage | None = None) -> None:
        self.calls.append(("extend_with_priority", slots.tolist()))
        self.updates.append((slots.tolist(), priority))


def test_rows_written_one_slot_each_reach_the_sampler_with_their_priorities() -> None:
    sampler = OneCallSampler()
    rb = TensorDictReplayBuffer(storage=ListStorage(8), sampler=sampler)
    slots = rb.extend(batch([0.5, 2.0, 1.0]))
    assert slots.tolist() == [0, 1, 2]
    assert sampler.calls == [("extend_with_priority", [0, 1, 2])]  # no extend, no update
    [(index, (tag, handed))] = sampler.updates
    assert index == [0, 1, 2] and tag == "checked" and handed.tolist() == [0.5, 2.0, 1.0]


def test_rows_without_priorities_are_extended_as_before() -> None:
    sampler = OneCallSampler()
    rb = TensorDictReplayBuffer(storage=ListStorage(8), sampler=sampler)
    rb.extend(TensorDict({"obs": torch.arange(2.0)}, [2]))
    assert sampler.calls == [("extend", [0, 1])] and sampler.updates == []


def test_a_batch_along_another_dim_is_extended_as_before() -> None:
    sampler = OneCallSampler()
    rb = TensorDictReplayBuffer(storage=ListStorage(8), sampler=sampler, dim_extend=1)
    data = TensorDict({"obs": torch.arange(6.0).reshape(2, 3),
                       "td_error": torch.arange(6.0).reshape(2, 3)}, [2, 3])
    with pytest.warns(UserWarning, match="cannot be matched"):  # as before the hook
        slots = rb.extend(data)  # three rows written along dim 1, each an item of two steps
    assert sampler.calls == [("extend", slots.tolist())]


def test_the_default_hook_is_an_extend_then_an_update() -> None:
    sampler = RecordingSampler(lambda p: p)
    calls = []
    sampler.extend = lambda slots: calls.append(slots.tolist())  # type: ignore[method-assign]
    sampler.extend_with_priority(torch.tensor([3, 4]), torch.tensor([1.0, 2.0]))
    assert calls == [[3, 4]]
    [(index, handed)] = sampler.updates
    assert index == [3, 4] and handed.tolist() == [1.0, 2.0]
