"""``sync=False`` prioritized buffers: a worker process empties (or restores) the shared
storage; the learner's trees start afresh when it next catches up.

The learner noticed a reset only by a write count that went back, so it missed (a) an
``empty()`` followed by at least as many writes as it had caught up with: the rewritten slots
kept the old items' priorities and write generations, and an update of a sample of the old
items was applied to the new ones; and (b) an ``empty(empty_write_count=False)``: slots past
the new length kept their priorities, and sampling raised ``IndexError`` ("priorities out of
step"). It reads the storage's ``shared_reset_count()`` now.
"""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch
from tensordict import TensorDict

from tdreplay.samplers import TensorDictPrioritizedReplayBuffer
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage

FORK = mp.get_context("fork")


def _rows(n: int, start: int, era: int) -> TensorDict:
    return TensorDict({"id": torch.arange(start, start + n),
                       "era": torch.full((n,), era, dtype=torch.long)}, [n])


def _buffer(storage) -> TensorDictPrioritizedReplayBuffer:
    return TensorDictPrioritizedReplayBuffer(alpha=1.0, beta=0.5, eps=0.0, batch_size=8,
                                             shared=True, sync=False, storage=storage)


def _worker(rb, how: str, n: int, queue) -> None:
    try:
        if how == "restore":
            rb.storage.load_state_dict(queue.get(timeout=10))
        else:
            rb.empty(empty_write_count=how == "empty")
            rb.extend(_rows(n, 100, era=1))
        queue.put("ok")
    except Exception as err:  # noqa: BLE001 - reported to the test
        queue.put(f"{type(err).__name__}: {err}")


def _run(rb, how: str, n: int = 0, payload=None) -> None:
    queue = FORK.Queue()
    if payload is not None:
        queue.put(payload)
    proc = FORK.Process(target=_worker, args=(rb, how, n, queue))
    proc.start()
    proc.join(timeout=60)
    assert proc.exitcode == 0
    assert queue.get(timeout=10) == "ok"


def _leaves(rb) -> torch.Tensor:
    return rb.prioritized_sampler.state_dict()["priorities"].clone()


STORAGES = {"shared_init": lambda: LazyTensorStorage(64, shared_init=True),
            "memmap": lambda: LazyMemmapStorage(64)}


def _learner(kind: str):
    rb = _buffer(STORAGES[kind]())
    rb.extend(_rows(50, 0, era=0))
    rb.sample()  # the learner catches up with 50 rows
    old = rb.sample(32)  # a sample of the old items, to update later
    rb.update_priority(torch.arange(50), torch.full((50,), 0.001))
    return rb, old


@pytest.mark.parametrize("kind", sorted(STORAGES))
def test_a_worker_empty_then_as_many_writes_is_noticed(kind: str) -> None:
    """(a): 60 rows written after the worker's empty, 50 caught up with before."""
    rb, old = _learner(kind)
    _run(rb, "empty", 60)
    assert len(rb) == 60 and rb.write_count == 60
    rb.sample()
    assert rb.sampler.caught_up == 60
    # every new row got the max priority (the old items' 0.001 is gone)
    assert _leaves(rb)[:60].tolist() == [1.0] * 60
    assert _leaves(rb)[60:].abs().sum() == 0
    # a stale update (of the items gone) is skipped: their write generations are gone too
    before = _leaves(rb)
    old["td_error"] = torch.full((32,), 50.0)
    rb.update_tensordict_priority(old)
    assert torch.equal(_leaves(rb), before)
    assert set(rb.sample(400)["era"].tolist()) == {1}


@pytest.mark.parametrize("kind", sorted(STORAGES))
def test_a_worker_empty_keeping_the_write_count_is_noticed(kind: str) -> None:
    """(b): ``empty(empty_write_count=False)`` and 10 rows: the write count went on to 60."""
    rb, old = _learner(kind)
    _run(rb, "keep_count", 10)
    assert len(rb) == 10 and rb.write_count == 60
    drawn = rb.sample(400)  # raised IndexError: "the sampler drew slot 49, ..."
    assert int(drawn["index"].max()) < 10 and set(drawn["era"].tolist()) == {1}
    assert _leaves(rb)[:10].tolist() == [1.0] * 10
    assert _leaves(rb)[10:].abs().sum() == 0
    before = _leaves(rb)
    old["td_error"] = torch.full((32,), 50.0)
    rb.update_tensordict_priority(old)  # stale: skipped, whether its slot was rewritten or not
    assert torch.equal(_leaves(rb), before)


def test_a_worker_restore_of_the_storage_is_noticed() -> None:
    """A storage restored in a worker to a state with as many rows: the learner's trees
    start afresh (the rows are other items)."""
    rb, _ = _learner("shared_init")
    other = LazyTensorStorage(64)
    other.set(slice(0, 50), _rows(50, 200, era=2))
    _run(rb, "restore", payload=other.state_dict())
    assert len(rb) == 50 and rb.write_count == 50
    rb.sample()
    assert _leaves(rb)[:50].tolist() == [1.0] * 50


def test_the_learner_own_empty_and_writes_keep_their_priorities() -> None:
    """No reset by another process: the learner's own empty and its writes with priorities
    are caught up with as before (the trees are not started afresh again)."""
    rb = _buffer(LazyTensorStorage(64, shared_init=True))
    rb.extend(_rows(10, 0, era=0))
    rb.sample()
    rb.empty()
    rb.extend(_rows(4, 10, era=1))
    rb.update_priority(torch.arange(4), torch.tensor([1.0, 2.0, 3.0, 4.0]))
    rb.sample()
    assert _leaves(rb)[:5].tolist() == [1.0, 2.0, 3.0, 4.0, 0.0]
    assert rb.sampler.caught_up == 4
