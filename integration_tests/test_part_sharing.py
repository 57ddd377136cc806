"""A bare storage, sampler or writer sent to a process being started (issue 17): the parts whose
state lives in this process's memory raise ``NotShareableError`` in the parent, the shareable
ones arrive and write where the parent sees it, and any other pickling is a plain copy."""

from __future__ import annotations

import copy
import multiprocessing as mp
import pickle

import pytest
import torch
import torch.multiprocessing as tmp
from tensordict import TensorDict

from tdreplay.core import (
    ListStorage,
    NotShareableError,
    RandomSampler,
    ReplayBuffer,
    RoundRobinWriter,
    TensorDictReplayBuffer,
)
from tdreplay.samplers import (
    DeferredPrioritizedSampler,
    PrioritizedSampler,
    PrioritizedSliceSampler,
)
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage
from tdreplay.writers import TensorDictMaxValueWriter

PRIVATE_PARTS = {
    "PrioritizedSampler": (lambda: PrioritizedSampler(8, alpha=1.0, beta=0.5),
                           "Samplers of type .*PrioritizedSampler.* cannot be shared between "
                           "processes.*sync=False"),
    "PrioritizedSliceSampler": (lambda: PrioritizedSliceSampler(8, alpha=1.0, beta=0.5,
                                                                num_slices=2),
                                "Samplers of type .*PrioritizedSliceSampler"),
    "ListStorage": (lambda: ListStorage(8), "Cannot share a storage of type .*ListStorage"),
    "LazyTensorStorage": (lambda: LazyTensorStorage(8),
                          "Cannot share a storage of type .*LazyTensorStorage"),
    "TensorDictMaxValueWriter": (lambda: TensorDictMaxValueWriter(rank_key="r"),
                                 "Writers of type .*TensorDictMaxValueWriter.* cannot be shared "
                                 "between processes"),
}


def _never_runs(part):  # the parent refuses before the child starts
    raise AssertionError(f"child received {type(part).__name__}")


def _write_from_child(storage, writer, samplers, queue):
    """Write 3 rows through the writer the parent registered on ``storage``; report what the
    child sees."""
    rows = writer.extend(TensorDict({"x": torch.tensor([7.0, 8.0, 9.0])}, [3]))
    deferred = samplers[1]
    queue.put((rows.tolist(), len(storage), writer.write_count, deferred.in_learner,
               deferred.is_prioritized, type(samplers[0]).__name__))


@pytest.mark.parametrize("name", sorted(PRIVATE_PARTS))
@pytest.mark.parametrize("context", [mp.get_context("spawn"), mp.get_context("forkserver"),
                                     tmp.get_context("spawn")],
                         ids=["spawn", "forkserver", "torch-spawn"])
def test_part_in_process_memory_refuses_a_process_being_started(name, context):
    make, message = PRIVATE_PARTS[name]
    part = make()
    child = context.Process(target=_never_runs, args=(part,))
    with pytest.raises(NotShareableError, match=message) as caught:
        child.start()
    assert isinstance(caught.value, RuntimeError)  # what TorchRL raises there
    assert child.pid is None  # refused in the parent, nothing started


def test_refusal_leaves_the_part_usable_and_copies_still_work():
    sampler = PrioritizedSampler(8, alpha=1.0, beta=0.5)
    rb = ReplayBuffer(storage=ListStorage(8), sampler=sampler, batch_size=4)
    rb.extend([torch.tensor(float(i)) for i in range(4)])
    rb.update_priority(torch.tensor([0, 1, 2, 3]), torch.tensor([1.0, 0.0, 0.0, 0.0]))
    with pytest.raises(NotShareableError):
        mp.get_context("spawn").Process(target=_never_runs, args=(sampler,)).start()
    with pytest.raises(NotShareableError, match="Cannot share a storage of type"):
        mp.get_context("spawn").Process(target=_never_runs, args=(rb,)).start()
    for clone in (copy.deepcopy(sampler), pickle.loads(pickle.dumps(sampler))):
        assert clone.max_priority == sampler.max_priority == 1.0
        assert clone.total_priority == pytest.approx(sampler.total_priority)
        index, _ = clone.sample(rb.storage, 6)
        assert index.tolist() == [0] * 6  # the copy's trees are the original's
    assert rb.sample().tolist() == [0.0] * 4  # the original goes on (item 0 is 0.0)


def test_unshareable_parts_copy_in_process_and_through_a_queue():
    storage = ListStorage(4)
    storage.set(torch.arange(2), ["a", {"b": 1}])
    writer = TensorDictMaxValueWriter(rank_key="r")
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(2), writer=writer)
    rb.extend(TensorDict({"r": torch.tensor([3.0, 1.0, 2.0]), "x": torch.arange(3)}, [3]))
    queue = mp.get_context("spawn").Queue()  # a queue to this same process: no child started
    queue.put((storage, writer))
    from_queue = queue.get(timeout=30)
    for clone_storage, clone_writer in (copy.deepcopy((storage, writer)),
                                        pickle.loads(pickle.dumps((storage, writer))),
                                        from_queue):
        assert clone_storage.get(torch.tensor([1, 0])) == [{"b": 1}, "a"]
        assert clone_writer.state_dict().keys() == writer.state_dict().keys()
        for key, value in writer.state_dict().items():
            assert torch.equal(torch.as_tensor(clone_writer.state_dict()[key]),
                               torch.as_tensor(value)), key


def test_share_refuses_a_prioritized_slice_sampler():
    rb = TensorDictReplayBuffer(storage=LazyMemmapStorage(8),
                                sampler=PrioritizedSliceSampler(8, 1.0, 0.5, num_slices=2),
                                batch_size=4)
    with pytest.raises(NotShareableError, match="PrioritizedSliceSampler.*sync=False"):
        rb.share()
    assert not rb.shared


def test_shareable_parts_reach_a_spawned_child_and_its_writes_reach_the_parent(tmp_path):
    storage = LazyMemmapStorage(8, scratch_dir=tmp_path / "rows")
    writer = RoundRobinWriter()
    writer.register_storage(storage)
    writer.extend(TensorDict({"x": torch.tensor([1.0, 2.0])}, [2]))
    deferred = DeferredPrioritizedSampler(PrioritizedSampler(8, alpha=1.0, beta=0.5), writer)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_write_from_child,
                        args=(storage, writer, (RandomSampler(), deferred), queue))
    child.start()
    try:
        rows, child_len, child_count, in_learner, prioritized, uniform = queue.get(timeout=240)
    finally:
        child.join(timeout=240)
    assert child.exitcode == 0
    assert rows == [2, 3, 4] and child_len == 5 and child_count == 5
    assert (in_learner, prioritized, uniform) == (False, False, "RandomSampler")
    assert len(storage) == 5 and writer.write_count == 5  # the child's writes, seen here
    assert storage.get(torch.arange(5))["x"].tolist() == [1.0, 2.0, 7.0, 8.0, 9.0]
    assert deferred.in_learner and deferred.prioritized.max_priority is not None
