"""A forked child of a prioritized buffer that is not shared (its priority trees stay in the
parent): ``update_priority`` is refused as the child's writes are. It was accepted and changed
only the child's copy of the trees, without an error."""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp
from tensordict import TensorDict

from tdreplay.samplers import TensorDictPrioritizedReplayBuffer
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage

FORK = mp.get_context("fork")


def _update_in_child(rb, queue) -> None:
    try:
        rb.update_priority(torch.tensor([0]), torch.tensor([5.0]))
        queue.put(f"updated: total {rb.sampler.total_priority}")
    except Exception as err:  # noqa: BLE001 - reported to the test
        queue.put(f"{type(err).__name__}: {err}")


@pytest.mark.parametrize("storage", [lambda: LazyMemmapStorage(16),
                                     lambda: LazyTensorStorage(16, shared_init=True)],
                         ids=["memmap", "shared-tensor"])
def test_a_forked_child_cannot_update_priorities_it_alone_would_see(storage):
    rb = TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=storage())
    rb.extend(TensorDict({"x": torch.ones(4)}, [4]))
    before = rb.sampler.total_priority
    queue = FORK.Queue()
    child = FORK.Process(target=_update_in_child, args=(rb, queue))
    child.start()
    said = queue.get(timeout=60)
    child.join(60)
    assert said.startswith("NotShareableError"), said
    assert rb.sampler.total_priority == before
    rb.update_priority(torch.tensor([0]), torch.tensor([5.0]))  # the parent's own: applied
    assert rb.sampler.total_priority != before
