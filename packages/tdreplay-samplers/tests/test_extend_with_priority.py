"""Rows written with their priorities: the buffer hands slots and priorities to the sampler in one
call (``extend_with_priority``), which on numba trees writes them in one kernel pass. The trees,
generations, max priority and what the buffer then samples are those of ``extend`` followed by
``update_priority``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer, Transform
from tdreplay.samplers import PrioritizedSampler, _priority_kernels
from tdreplay.samplers._host_threads import MIN_ITEMS_PER_THREAD
from tdreplay.storages import LazyTensorStorage
from tdreplay.writers import TensorDictMaxValueWriter


class TwoCalls(PrioritizedSampler):
    """Overrides ``extend``, so its ``extend_with_priority`` is the two calls."""

    def extend(self, slots: torch.Tensor) -> None:
        super().extend(slots)


def buffer(sampler_class: type[PrioritizedSampler], capacity: int, **kwargs: Any
           ) -> TensorDictReplayBuffer:
    sampler = sampler_class(capacity, alpha=0.7, beta=0.5, **kwargs)
    return TensorDictReplayBuffer(storage=LazyTensorStorage(capacity), sampler=sampler,
                                  batch_size=64, priority_key="td_error")


def rows(n: int, seed: int) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    return TensorDict({"obs": torch.randn(n, 3, generator=g),
                       "td_error": torch.rand(n, generator=g) * 4}, [n])


def state_of(rb: TensorDictReplayBuffer) -> list[Any]:
    state = rb.sampler._state
    arrays = [state.sum_tree.nodes, state.min_tree.nodes, state.host_generation]
    if state.max_tree is not None:
        arrays.append(state.max_tree.nodes)
    return [a.copy() for a in arrays] + [rb.sampler.max_priority]


def assert_same(one: list[Any], other: list[Any]) -> None:
    for a, b in zip(one, other):
        if isinstance(a, np.ndarray):
            assert np.array_equal(a, b)
        else:
            assert a == b


@pytest.mark.parametrize("within_buffer", [False, True])
@pytest.mark.parametrize(("capacity", "sizes"), [
    (1000, [300, 300, 600]),  # the last one wraps around
    (100, [150]),  # one batch writes slots 0..49 twice: the last duplicate wins
])
def test_one_pass_leaves_what_extend_and_update_leave(within_buffer, capacity, sizes):
    results = []
    for sampler_class in (PrioritizedSampler, TwoCalls):
        rb = buffer(sampler_class, capacity, max_priority_within_buffer=within_buffer)
        for seed, n in enumerate(sizes):
            rb.extend(rows(n, seed))
        state = state_of(rb)
        rb.sampler.set_rng(torch.Generator().manual_seed(0))
        results.append((state, rb.sample()))
    (state_one, sample_one), (state_two, sample_two) = results
    assert_same(state_one, state_two)
    assert torch.equal(sample_one["index"], sample_two["index"])
    assert torch.equal(sample_one["priority_weight"], sample_two["priority_weight"])
    # the rows' own priorities are stored, the latest write of a slot winning
    last = rows(sizes[-1], len(sizes) - 1)["td_error"].double()
    slot = (sum(sizes) - 1) % capacity
    stored = rb.sampler.state_dict()["priorities"][slot]
    assert stored.item() == pytest.approx((last[-1].item() + 1e-8) ** 0.7)


def test_the_buffer_writes_rows_and_priorities_without_an_update(monkeypatch):
    rb = buffer(PrioritizedSampler, 1000)
    rb.extend(rows(10, 0))  # the trees exist

    def no_update(*args: object, **kwargs: object) -> bool:
        raise AssertionError("extend_with_priority went through update")

    monkeypatch.setattr(_priority_kernels.NumbaKernels, "update", no_update)
    written = rows(200, 1)
    slots = rb.extend(written)
    assert torch.equal(slots, torch.arange(10, 210))
    leaves = rb.sampler.state_dict()["priorities"][10:210]
    torch.testing.assert_close(leaves, (written["td_error"].double() + 1e-8) ** 0.7)
    assert rb.sampler.max_priority == pytest.approx(written["td_error"].max().item())
    assert "index" not in written.keys()  # the caller's batch as it was


def test_a_large_write_splits_over_threads_with_the_same_trees(monkeypatch):
    n = 3 * MIN_ITEMS_PER_THREAD
    results = []
    monkeypatch.setattr(_priority_kernels.NumbaKernels, "update", None)  # one pass, no update
    for parts in (1, 4):
        monkeypatch.setattr(_priority_kernels, "thread_count", lambda _, k=parts: k)
        rb = buffer(PrioritizedSampler, 2 * n, max_priority_within_buffer=True)
        rb.extend(rows(n, 0))
        rb.extend(rows(n + 1000, 1))  # wraps around
        results.append(state_of(rb))
    assert_same(*results)


def test_a_max_value_writer_keeping_some_rows_gives_them_their_priorities():
    # the writer says which batch rows it kept (Writer.written_positions): each kept row gets
    # its own td_error (it got the max priority, with a warning, before)
    sampler = PrioritizedSampler(4, alpha=1.0, beta=1.0)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(4), sampler=sampler,
                                writer=TensorDictMaxValueWriter(rank_key="reward"),
                                priority_key="td_error")
    batch = TensorDict({"reward": torch.tensor([1.0, 5.0, 2.0, 4.0, 3.0, 0.5]),
                        "td_error": torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])}, [6])
    slots = rb.extend(batch)
    assert slots[[0, 5]].tolist() == [-1, -1]  # rewards 1 and 0.5: not kept
    priorities = sampler.state_dict()["priorities"][slots[1:5]]  # rewards 5, 2, 4, 3
    torch.testing.assert_close(priorities,
                               torch.tensor([2.0, 3.0, 4.0, 5.0], dtype=torch.float64) + 1e-8)


def test_device_trees_take_the_two_calls():
    rb = buffer(PrioritizedSampler, 100, backend="torch")
    written = rows(30, 0)
    rb.extend(written)
    leaves = rb.sampler.state_dict()["priorities"][:30]
    torch.testing.assert_close(leaves, (written["td_error"].double() + 1e-8) ** 0.7)


class HoldLastRow(Transform):
    """A write-side transform that writes a batch's rows but its last, held back and written
    first with the next batch (the way MultiStepTransform holds steps back)."""

    def __init__(self) -> None:
        super().__init__()
        self.held: TensorDict | None = None

    def inv(self, data: TensorDict) -> TensorDict:
        rows = data if self.held is None else torch.cat([self.held, data])
        self.held = rows[-1:].clone()
        return rows[:-1]


@pytest.mark.parametrize("transform", ["flip", "hold"])
def test_priorities_are_those_of_the_rows_the_write_side_transforms_write(transform):
    # they were read from the batch given and matched to the slots by position: a transform
    # reordering or holding back rows gave rows the priorities of others (TorchRL reads them
    # from the transformed batch)
    sampler = PrioritizedSampler(20, alpha=1.0, beta=1.0)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(20), sampler=sampler,
                                priority_key="td_error")
    if transform == "flip":
        rb.append_transform(lambda td: td.flip(0), invert=True)
    else:
        rb.append_transform(HoldLastRow())
    for start in (0, 4):
        obs = torch.arange(start, start + 4.0)
        rb.extend(TensorDict({"obs": obs, "td_error": obs * 10 + 1}, [4]))
    stored = rb.storage.get(torch.arange(len(rb)))
    priorities = sampler.state_dict()["priorities"][: len(rb)]
    torch.testing.assert_close(priorities, (stored["td_error"].double() + 1e-8))


def test_the_priority_of_an_added_item_is_that_of_the_item_written():
    class Rescore(Transform):
        def inv(self, data: TensorDict) -> TensorDict:
            return data.set("td_error", data["td_error"] * 100)

    sampler = PrioritizedSampler(4, alpha=1.0, beta=1.0)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(4), sampler=sampler,
                                priority_key="td_error", transform=Rescore())
    rb.add(TensorDict({"td_error": torch.tensor(0.5)}, []))
    assert rb.storage.get(0)["td_error"].item() == 50.0
    assert sampler.state_dict()["priorities"][0].item() == pytest.approx(50.0)
