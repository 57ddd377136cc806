"""Sharing a buffer between processes (buffer_sharing): what cannot be shared raises."""

from __future__ import annotations

import copy
import multiprocessing as mp
import pickle

import pytest
import torch

from tdreplay.core import (
    ListStorage,
    NotShareableError,
    RandomSampler,
    ReplayBuffer,
    RoundRobinWriter,
    Transform,
    Writer,
)


class _WriteState(Transform):
    requires_shared_write_state = True


class _SharedWriteState(Transform):
    requires_shared_write_state = True
    shared_calls = 0

    def share_memory_(self) -> Transform:
        self.shared_calls += 1
        return self


class _Unshareable(RandomSampler):
    shareable = False


def _extend(rb, queue):
    try:
        rb.extend([torch.tensor(1.0)])
        queue.put("wrote")
    except NotShareableError as err:
        queue.put(str(err))


def _in_forked_child(target, *args):
    """Run ``target(*args, queue)`` in a forked child; the first thing it put in the queue."""
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=target, args=(*args, queue))
    child.start()
    child.join()
    assert child.exitcode == 0
    return queue.get(timeout=10), queue


def test_forked_child_using_a_list_storage_raises_instead_of_diverging():
    rb = ReplayBuffer(storage=ListStorage(10))
    rb.extend([torch.tensor(0.0)])
    said, _ = _in_forked_child(_extend, rb)
    assert said.startswith("Cannot share a storage of type")
    assert len(rb) == 1
    rb.extend([torch.tensor(2.0)])  # the parent itself goes on
    assert len(rb) == 2


def _read(rb, queue):
    queue.put(len(rb[:]))


def test_forked_child_may_read_its_copy():
    rb = ReplayBuffer(storage=ListStorage(10))
    rb.extend([torch.tensor(0.0), torch.tensor(1.0)])
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_read, args=(rb, queue))
    child.start()
    child.join()
    assert child.exitcode == 0 and queue.get(timeout=10) == 2


def test_spawning_a_child_with_a_list_storage_raises_in_the_parent():
    rb = ReplayBuffer(storage=ListStorage(10))
    ctx = mp.get_context("spawn")
    child = ctx.Process(target=_extend, args=(rb, ctx.Queue()))
    with pytest.raises(RuntimeError, match="Cannot share a storage of type .*ListStorage"):
        child.start()


def test_pickling_outside_a_process_start_is_a_copy():
    rb = ReplayBuffer(storage=ListStorage(10), shared=True)
    rb.extend([torch.tensor(3.0)])
    copy = pickle.loads(pickle.dumps(rb))
    assert copy.shared and len(copy) == 1


def test_share_refuses_unshareable_sampler_and_prefetch():
    rb = ReplayBuffer(storage=ListStorage(10), sampler=_Unshareable())
    with pytest.raises(NotShareableError, match="_Unshareable.*sync=False"):
        rb.share()
    assert not rb.shared
    with pytest.raises(ValueError, match="prefetch=0 or shared=False"):
        ReplayBuffer(storage=ListStorage(10), batch_size=2, prefetch=1, shared=True)
    assert ReplayBuffer(storage=ListStorage(10), shared=True).share(False).shared is False


def test_transforms_with_write_state_are_shared_or_refused():
    rb = ReplayBuffer(storage=ListStorage(10), shared=True)
    with pytest.raises(RuntimeError, match="write state"):
        rb.append_transform(_WriteState())
    with pytest.raises(RuntimeError, match="write state"):
        rb.insert_transform(0, _WriteState(), invert=True)
    assert len(rb.transform) == 0
    ok = _SharedWriteState()
    rb.append_transform(ok, invert=True)
    assert ok.shared_calls == 1
    plain = ReplayBuffer(storage=ListStorage(10))
    plain.append_transform(_WriteState())  # not shared: nothing to refuse
    with pytest.raises(RuntimeError, match="write state"):
        plain.share()
    assert not plain.shared


class _HeapWriter(RoundRobinWriter):
    shareable = False  # e.g. a heap of ranks in this process's memory


class _SharedRows(ListStorage):
    """A list storage that claims to share its rows (a process lock), so that only the writer
    is left to refuse."""

    process_lock = mp.get_context("fork").RLock()


def test_writer_shareable_defaults_and_share_refuses_unshareable_writer():
    assert Writer.shareable is True and RoundRobinWriter().shareable is True
    rb = ReplayBuffer(storage=ListStorage(10), writer=_HeapWriter())
    with pytest.raises(NotShareableError, match="Writers of type .*_HeapWriter.* cannot be "
                                                "shared between processes"):
        rb.share()
    assert not rb.shared
    with pytest.raises(NotShareableError, match="_HeapWriter"):
        ReplayBuffer(storage=ListStorage(10), writer=_HeapWriter(), shared=True)


def test_forked_child_writing_through_unshareable_writer_raises_and_writes_nothing():
    rb = ReplayBuffer(storage=_SharedRows(10), writer=_HeapWriter())
    rb.extend([torch.tensor(0.0)])
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_extend, args=(rb, queue))
    child.start()
    child.join()
    assert child.exitcode == 0
    message = queue.get(timeout=10)
    assert message.startswith("Writers of type") and "_HeapWriter" in message
    assert len(rb) == 1 and rb.write_count == 1


def test_check_shareable_names_the_unshareable_writer():
    rb = ReplayBuffer(storage=_SharedRows(10), writer=_HeapWriter())
    with pytest.raises(NotShareableError, match="Writers of type .*_HeapWriter"):
        rb.check_shareable()


def _never_runs(part):  # the parent refuses before the child starts
    raise AssertionError(f"child received {type(part).__name__}")


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
@pytest.mark.parametrize("make, message", [
    (lambda: ListStorage(4), "Cannot share a storage of type .*ListStorage"),
    (_Unshareable, "Samplers of type .*_Unshareable.* cannot be shared .*sync=False"),
    (_HeapWriter, "Writers of type .*_HeapWriter.* cannot be shared between processes"),
], ids=["storage", "sampler", "writer"])
def test_bare_part_in_process_memory_refuses_a_process_being_started(method, make, message):
    part = make()
    child = mp.get_context(method).Process(target=_never_runs, args=([part],))
    with pytest.raises(NotShareableError, match=message):
        child.start()
    assert child.pid is None
    assert isinstance(NotShareableError("x"), RuntimeError)  # TorchRL raises a RuntimeError


def test_bare_parts_copy_in_process():
    storage = ListStorage(4)
    storage.set(torch.arange(2), ["a", "b"])
    writer = _HeapWriter()
    writer.register_storage(storage)
    writer.extend(["c"])
    for clone_storage, clone_writer, clone_sampler in (
            copy.deepcopy((storage, writer, _Unshareable())),
            pickle.loads(pickle.dumps((storage, writer, _Unshareable())))):
        # (the writer appends after the storage's written rows)
        assert clone_storage[:] == storage[:] == ["a", "b", "c"] and clone_writer.write_count == 1
        assert clone_writer.storage is clone_storage and type(clone_sampler) is _Unshareable


def test_shareable_declared_on_the_bases():
    assert ListStorage(4).shareable is False and _SharedRows(4).shareable is True
    assert RandomSampler().shareable and not _Unshareable().shareable
    _SharedRows(4).check_shareable()
    RandomSampler().check_shareable()
    RoundRobinWriter().check_shareable()
    with pytest.raises(NotShareableError, match="ListStorage"):
        ListStorage(4).check_shareable()


def _empty_or_update(rb, what, queue):
    try:
        if what == "empty":
            rb.empty()
        else:
            rb.update_priority(torch.tensor([0]), torch.tensor([5.0]))
        queue.put("changed")
    except NotShareableError as err:
        queue.put(type(err).__name__)
    queue.put(len(rb))


@pytest.mark.parametrize("what", ["empty", "update_priority"])
def test_a_forked_child_cannot_empty_or_update_what_it_cannot_share(what):
    # (empty() cleared the child's copy, or the rows of a shared storage under the parent's
    # priorities; priority updates stayed in the child: the learner's updates were lost)
    from tdreplay.samplers import PrioritizedSampler

    sampler = PrioritizedSampler(10, alpha=1.0, beta=1.0) if what == "update_priority" else None
    rb = ReplayBuffer(storage=ListStorage(10), sampler=sampler)
    rb.extend([torch.tensor(0.0), torch.tensor(1.0)])
    said, queue = _in_forked_child(_empty_or_update, rb, what)
    assert said == "NotShareableError"
    assert queue.get(timeout=10) == 2  # the child's copy unchanged too
    assert len(rb) == 2


def test_a_rate_limited_buffer_is_not_shared(tmp_path):
    # (a forked collector's inserts never reached the parent's limiter: the learner waited for
    # them for good)
    from tdreplay.core import SampleToInsertRatio
    from tdreplay.storages import LazyMemmapStorage

    def limited(storage):
        limiter = SampleToInsertRatio(1.0, 2, error_buffer=(0.0, 100.0), timeout=0)
        return ReplayBuffer(storage=storage, rate_limiter=limiter)

    rb = limited(ListStorage(10))
    with pytest.raises(NotShareableError, match="rate limiter .*RayReplayBuffer"):
        rb.share()
    assert not rb.shared
    rb = limited(LazyMemmapStorage(10, scratch_dir=tmp_path / "rows"))  # (a shared storage)
    rb.extend(torch.zeros(1))
    said, _ = _in_forked_child(_extend, rb)
    assert said.startswith("Cannot share a buffer with a rate limiter")
    assert len(rb) == 1
