"""Prioritized buffers with ``sync=False`` (DeferredPrioritizedSampler): worker processes write
into a shared buffer, the learner keeps the priority trees and catches up with their writes."""

from __future__ import annotations

import multiprocessing as mp
import pickle

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ListStorage, NotShareableError, RandomSampler, ReplayBuffer
from tdreplay.samplers import (
    DeferredPrioritizedSampler,
    LinearScheduler,
    PrioritizedReplayBuffer,
    PrioritizedSampler,
    TensorDictPrioritizedReplayBuffer,
)
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage

FORK = mp.get_context("fork")


def _tdprb(**kw) -> TensorDictPrioritizedReplayBuffer:
    kw.setdefault("storage", LazyMemmapStorage(32, shared_init=True))
    return TensorDictPrioritizedReplayBuffer(alpha=1.0, beta=0.5, eps=0.0,
                                             priority_key=("prio", "td_error"), batch_size=4,
                                             shared=True, sync=False, **kw)


def _worker_extend(rb, worker_id, queue):
    try:
        td = TensorDict({"obs": torch.full((4, 1), float(worker_id)),
                         "prio": {"td_error": torch.full((4,), 100.0)}}, [4])
        rb.extend(td)
        queue.put("ok")
    except Exception as err:  # noqa: BLE001 - reported to the test
        queue.put(f"{type(err).__name__}: {err}")


def _worker_sample(rb, queue):
    try:
        rb.sample()
        queue.put("sampled")
    except RuntimeError as err:
        queue.put(str(err))


def test_workers_write_learner_samples_by_priority() -> None:
    rb = _tdprb()
    assert not rb.sync and isinstance(rb.sampler, DeferredPrioritizedSampler)
    assert rb.sampler.shareable and rb.shared
    queue = FORK.Queue()
    procs = [FORK.Process(target=_worker_extend, args=(rb, k, queue)) for k in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        assert p.exitcode == 0
    assert [queue.get(timeout=10) for _ in procs] == ["ok", "ok"]
    assert rb.write_count == 8 and len(rb) == 8
    assert rb.sampler.caught_up == 0  # the learner has not looked yet
    sample = rb.sample()
    assert rb.sampler.caught_up == 8
    # the workers' td_error (100) was not applied: every row has the max priority (1)
    assert rb.prioritized_sampler.total_priority == pytest.approx(8.0)
    assert sample["priority_weight"].tolist() == [1.0] * 4
    assert sorted(sample.keys()) == ["index", "obs", "prio", "priority_weight",
                                     "write_generation"]
    # the learner's updates steer sampling
    update = TensorDict({"index": torch.arange(8),
                         "prio": {"td_error": torch.tensor([0.0] * 7 + [5.0])}}, [8])
    rb.update_tensordict_priority(update)
    assert rb.prioritized_sampler.max_priority == 5.0
    assert set(rb.sample(16)["index"].tolist()) == {7}


def test_worker_cannot_sample_or_update() -> None:
    rb = _tdprb()
    rb.extend(TensorDict({"obs": torch.zeros(4, 1)}, [4]))
    queue = FORK.Queue()
    child = FORK.Process(target=_worker_sample, args=(rb, queue))
    child.start()
    child.join()
    assert "a worker process cannot sample, update priorities" in queue.get(timeout=10)
    assert len(rb.sample()) == 4  # the learner still can


def test_extend_with_update_priority_in_a_worker_raises() -> None:
    rb = _tdprb()
    sampler = rb.sampler
    sampler._learner_pid = -1  # this process plays a worker  # noqa: SLF001
    assert not sampler.is_prioritized
    with pytest.raises(RuntimeError, match="does not support updating priorities from writer"):
        rb.extend(TensorDict({"obs": torch.zeros(2, 1)}, [2]), update_priority=True)
    assert len(rb) == 0
    with pytest.raises(RuntimeError, match="worker process"):
        rb.update_priority(torch.tensor([0]), torch.tensor([1.0]))
    with pytest.raises(RuntimeError, match="worker process"):
        _ = rb.prioritized_sampler


def test_learner_writes_take_their_priorities() -> None:
    rb = _tdprb(storage=LazyTensorStorage(8))
    td = TensorDict({"obs": torch.zeros(3, 1), "prio": {"td_error": torch.tensor([1., 2., 6.])}},
                    [3])
    rb.extend(td)
    assert rb.prioritized_sampler.total_priority == pytest.approx(9.0)
    assert rb.prioritized_sampler.max_priority == 6.0


def test_catch_up_wraps_and_follows_empty() -> None:
    rb = PrioritizedReplayBuffer(alpha=1.0, beta=1.0, eps=0.0, storage=ListStorage(4),
                                 sync=False)
    rb.extend([torch.tensor(i) for i in range(3)])
    rb.update_priority(torch.arange(3), torch.tensor([2.0, 2.0, 2.0]))
    assert rb.sampler.caught_up == 3
    rb.extend([torch.tensor(i) for i in range(6)])  # 9 written: every row rewritten
    rb.sample(2)
    assert rb.sampler.caught_up == 9
    # rewritten rows get the max priority (2)
    assert rb.prioritized_sampler.total_priority == pytest.approx(8.0)
    rb.empty()
    assert rb.sampler.caught_up == 0 and rb.prioritized_sampler.total_priority == 0.0
    rb.extend([torch.tensor(7)])
    assert rb.sample(3).tolist() == [7, 7, 7]
    rb.empty(empty_write_count=False)  # the count goes on: only new rows are caught up with
    rb.extend([torch.tensor(8)])
    assert rb.sample(3).tolist() == [8, 8, 8]
    assert rb.prioritized_sampler.total_priority == pytest.approx(1.0)  # empty forgot the max


def test_sync_false_refuses_multidimensional_storage_and_bad_sync() -> None:
    with pytest.raises(ValueError, match="only support 1-D storages when sync=False"):
        TensorDictPrioritizedReplayBuffer(alpha=1.0, beta=1.0, sync=False,
                                          storage=LazyTensorStorage(8, ndim=2))
    with pytest.raises(TypeError, match="sync"):
        PrioritizedReplayBuffer(alpha=1.0, beta=1.0, sync="no")


def test_sync_true_buffer_refuses_sharing_and_names_sync_false() -> None:
    with pytest.raises(NotShareableError, match="sync=False"):
        TensorDictPrioritizedReplayBuffer(alpha=1.0, beta=1.0, shared=True,
                                          storage=LazyMemmapStorage(8))
    rb = PrioritizedReplayBuffer(alpha=1.0, beta=1.0, storage=ListStorage(4))
    assert rb.sync and rb.prioritized_sampler is rb.sampler
    assert ReplayBuffer(storage=ListStorage(4), sampler=RandomSampler()).sampler.shareable


def test_spawned_copy_leaves_the_trees_behind_and_file_copy_keeps_them() -> None:
    rb = PrioritizedReplayBuffer(alpha=1.0, beta=1.0, eps=0.0, storage=ListStorage(4),
                                 sync=False)
    rb.extend([torch.tensor(1), torch.tensor(2)])
    rb.update_priority(torch.tensor([1]), torch.tensor([3.0]))
    copy = pickle.loads(pickle.dumps(rb))  # a file or a queue: a learner where it lands
    assert copy.prioritized_sampler.total_priority == pytest.approx(4.0)
    sampler = rb.sampler
    import tdreplay.samplers.deferred_prioritized as mod

    original = mod.sending_to_new_process
    mod.sending_to_new_process = lambda: True
    try:
        state = sampler.__getstate__()
    finally:
        mod.sending_to_new_process = original
    assert state["_prioritized"] is None


def test_state_dict_round_trip_and_refusals() -> None:
    rb = PrioritizedReplayBuffer(alpha=1.0, beta=1.0, eps=0.0, storage=ListStorage(4),
                                 sync=False, batch_size=2)
    rb.extend([torch.tensor(i) for i in range(3)])
    rb.update_priority(torch.tensor([2]), torch.tensor([5.0]))
    state = rb.state_dict()
    other = PrioritizedReplayBuffer(alpha=1.0, beta=1.0, eps=0.0, storage=ListStorage(4),
                                    sync=False, batch_size=2)
    other.load_state_dict(state)
    assert other.sampler.caught_up == 3
    assert other.prioritized_sampler.total_priority == pytest.approx(7.0)
    g1, g2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    rb.set_rng(g1)
    other.set_rng(g2)
    assert torch.equal(rb.sample(), other.sample())
    with pytest.raises(ValueError, match="caught_up"):
        other.sampler.load_state_dict({"prioritized": state["_sampler"]["prioritized"],
                                       "caught_up": -1})
    assert other.sampler.caught_up == 3


def test_scheduler_reaches_the_learner_trees() -> None:
    rb = PrioritizedReplayBuffer(alpha=1.0, beta=1.0, eps=0.0, storage=ListStorage(4),
                                 sync=False)
    rb.extend([torch.tensor(i) for i in range(2)])
    rb.update_priority(torch.arange(2), torch.tensor([1.0, 3.0]))
    LinearScheduler(rb, "alpha", final_value=2.0, num_steps=1).step()
    assert rb.prioritized_sampler.alpha == 2.0
    assert rb.prioritized_sampler.total_priority == pytest.approx(10.0)


def test_deferred_sampler_needs_a_writer_and_a_prioritized_sampler() -> None:
    with pytest.raises(TypeError, match="prioritized"):
        DeferredPrioritizedSampler(RandomSampler())
    s = DeferredPrioritizedSampler(PrioritizedSampler(4, alpha=1.0, beta=1.0))
    storage = ListStorage(4)
    storage.set(torch.arange(1), ["a"])
    with pytest.raises(RuntimeError, match="follow"):
        s.sample(storage, 1)


def test_a_write_count_ahead_of_the_storage_gives_only_written_rows_a_priority():
    """A writer count ahead of the rows the storage holds (a restored state, a storage emptied
    elsewhere): catching up gave every row a priority, unwritten ones included, and the next
    sample raised IndexError ('priorities out of step'). Only the written rows count now."""
    def make():
        return TensorDictPrioritizedReplayBuffer(alpha=1.0, beta=0.5, eps=0.0, sync=False,
                                                 priority_key=("prio", "td_error"),
                                                 storage=LazyTensorStorage(32))

    rb = make()
    rb.extend(TensorDict({"obs": torch.arange(6.0).unsqueeze(-1),
                          "prio": {"td_error": torch.ones(6)}}, [6]))
    state = rb.state_dict()
    state["_writer"]["write_count"] = 10**6
    restored = make()
    restored.load_state_dict(state)
    for _ in range(20):
        index = restored.sample(4)["index"]
        assert bool(((index >= 0) & (index < 6)).all())
    restored.extend(TensorDict({"obs": torch.full((2, 1), 9.0),
                                "prio": {"td_error": torch.ones(2)}}, [2]))
    drawn = torch.cat([restored.sample(4)["index"] for _ in range(40)])
    assert set(drawn.tolist()) == set(range(8))
