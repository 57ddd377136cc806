"""Ensembles between processes: an ensemble is shareable only if every member is."""

import contextlib
import copy
import multiprocessing as mp
import multiprocessing.context
import pickle

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import (
    ListStorage,
    NotShareableError,
    RandomSampler,
    ReplayBuffer,
    RoundRobinWriter,
    SamplerWithoutReplacement,
    TensorDictReplayBuffer,
)
from tdreplay.ensembles import (
    ReplayBufferEnsemble,
    SamplerEnsemble,
    StorageEnsemble,
    WriterEnsemble,
)
from tdreplay.samplers import PrioritizedSampler
from tdreplay.storages import LazyTensorStorage


class _HeapWriter(RoundRobinWriter):
    shareable = False  # e.g. a heap of ranks in this process's memory


def _never_runs(part):  # the parent refuses before the child starts
    raise AssertionError(f"child received {type(part).__name__}")


def _start(method, part):
    """Start a child of ``method`` that receives ``part``: what pickling it for a process being
    started runs (as core's tests do); returns the child, which never starts if it raises."""
    child = mp.get_context(method).Process(target=_never_runs, args=([part],))
    child.start()
    return child


@contextlib.contextmanager
def _pickling_for_a_process_being_started():
    """What ``Process.start()`` of the spawn start method sets while it pickles the child's
    arguments, so that a part pickled here sees itself sent to a process being started."""
    multiprocessing.context.set_spawning_popen(object())
    try:
        yield
    finally:
        multiprocessing.context.set_spawning_popen(None)


def _data(n, value):
    return TensorDict(obs=torch.full((n,), float(value)), batch_size=[n])


def _shared_storage(rows=0, value=0.0):
    storage = LazyTensorStorage(8, shared_init=True)
    if rows:
        storage.set(torch.arange(rows), _data(rows, value))
    return storage


def _filled_prioritized():
    sampler = PrioritizedSampler(8, alpha=1.0, beta=1.0)
    sampler.extend(torch.arange(3))
    sampler.update_priority(torch.tensor([0, 1, 2]), torch.tensor([1.0, 2.0, 4.0]))
    return sampler


# ---- the component ensembles ---------------------------------------------------------------------


def test_ensembles_of_shareable_members_are_shareable():
    storages = StorageEnsemble(_shared_storage(), _shared_storage())
    samplers = SamplerEnsemble(RandomSampler(), SamplerWithoutReplacement())
    writers = WriterEnsemble(RoundRobinWriter(), RoundRobinWriter())
    for ensemble in (storages, samplers, writers):
        assert ensemble.shareable is True
        ensemble.check_shareable()  # nothing to refuse


def test_a_storage_ensemble_pickled_for_a_process_being_started_shares_its_rows():
    storages = StorageEnsemble(_shared_storage(2, 1.0), _shared_storage(3, 2.0))
    with _pickling_for_a_process_being_started():
        payload = pickle.dumps(storages)
    other = pickle.loads(payload)
    other[1].set(torch.arange(3, 5), _data(2, 7.0))  # the copy's write reaches the original
    assert len(storages[1]) == 5
    assert storages[1][:]["obs"].tolist() == [2.0, 2.0, 2.0, 7.0, 7.0]
    assert storages[0][:]["obs"].tolist() == [1.0, 1.0]


def test_shareable_ensemble_reaches_a_spawned_child():
    samplers = SamplerEnsemble(RandomSampler(), RandomSampler(), p=[0.25, 0.75])
    child = mp.get_context("spawn").Process(target=len, args=(samplers,))
    child.start()
    child.join(timeout=120)
    assert child.exitcode == 0  # the child unpickled the ensemble and took its len


_UNSHAREABLE = {
    "storage": (lambda: StorageEnsemble(_shared_storage(2, 1.0), ListStorage(4)),
                r"StorageEnsemble'> cannot be shared between processes: its member 1 "
                r"\(ListStorage\) cannot\. Cannot share a storage of type .*ListStorage.*"
                r"LazyMemmapStorage"),
    "sampler": (lambda: SamplerEnsemble(RandomSampler(), _filled_prioritized()),
                r"SamplerEnsemble'> cannot be shared between processes: its member 1 "
                r"\(PrioritizedSampler\) cannot\. Samplers of type .*PrioritizedSampler.* "
                r"cannot be shared .*sync=False"),
    "writer": (lambda: WriterEnsemble(_HeapWriter(), RoundRobinWriter()),
               r"WriterEnsemble'> cannot be shared between processes: its member 0 "
               r"\(_HeapWriter\) cannot\. Writers of type .*_HeapWriter.* cannot be shared"),
}


def _snapshot(ensemble):
    """What must not change: the members (the same objects) and their state."""
    members = getattr(ensemble, "storages", None) or getattr(ensemble, "samplers", None) \
        or ensemble.writers
    return list(members), repr(ensemble.state_dict())


@pytest.mark.parametrize("kind", list(_UNSHAREABLE))
def test_an_unshareable_member_makes_the_ensemble_unshareable(kind):
    make, message = _UNSHAREABLE[kind]
    ensemble = make()
    before = _snapshot(ensemble)
    assert ensemble.shareable is False
    with pytest.raises(NotShareableError, match=message):
        ensemble.check_shareable()
    with pytest.raises(NotShareableError, match=message), _pickling_for_a_process_being_started():
        pickle.dumps(ensemble)
    members, state = _snapshot(ensemble)
    assert all(a is b for a, b in zip(members, before[0])) and len(members) == len(before[0])
    assert state == before[1]
    with pytest.raises(AttributeError, match="follows its members"):
        ensemble.shareable = True
    assert ensemble.shareable is False


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
@pytest.mark.parametrize("kind", list(_UNSHAREABLE))
def test_an_unshareable_ensemble_refuses_a_process_being_started(kind, method):
    make, message = _UNSHAREABLE[kind]
    ensemble = make()
    before = _snapshot(ensemble)
    with pytest.raises(NotShareableError, match=message):
        _start(method, ensemble)
    assert _snapshot(ensemble)[1] == before[1]


def test_an_unshareable_ensemble_still_copies_in_process():
    samplers = SamplerEnsemble(RandomSampler(), _filled_prioritized())
    for clone in (pickle.loads(pickle.dumps(samplers)), copy.deepcopy(samplers)):
        assert clone[1] is not samplers[1]
        assert clone[1].total_priority == pytest.approx(7.0)


# ---- buffers over ensembles -----------------------------------------------------------------------


def _buffers(*samplers):
    return [TensorDictReplayBuffer(storage=_shared_storage(), sampler=sampler)
            for sampler in samplers]


def test_shared_ensemble_shares_its_buffers():
    rbs = _buffers(RandomSampler(), RandomSampler())
    rb = ReplayBufferEnsemble(*rbs, shared=True, batch_size=4)
    assert rb.shared and all(member.shared for member in rbs)
    rb.check_shareable()
    assert rb[1:].shared  # a smaller ensemble over the same buffers
    assert rb.share(False).shared is False and all(member.shared for member in rbs)


def test_shared_ensemble_with_an_unshareable_sampler_raises_and_marks_nothing():
    rbs = _buffers(RandomSampler(), PrioritizedSampler(8, alpha=1.0, beta=1.0))
    with pytest.raises(NotShareableError, match=r"its member 1 \(PrioritizedSampler\) cannot"):
        ReplayBufferEnsemble(*rbs, shared=True)
    rb = ReplayBufferEnsemble(*rbs)
    with pytest.raises(NotShareableError, match=r"its member 1 \(PrioritizedSampler\) cannot"):
        rb.share()
    assert not rb.shared and not any(member.shared for member in rbs)


def test_a_buffer_over_component_ensembles_with_shared_true_raises():
    with pytest.raises(NotShareableError, match=r"its member 0 \(_HeapWriter\) cannot"):
        ReplayBuffer(storage=StorageEnsemble(_shared_storage(), _shared_storage()),
                     sampler=SamplerEnsemble(RandomSampler(), RandomSampler()),
                     writer=WriterEnsemble(_HeapWriter(), RoundRobinWriter()), shared=True)


def test_share_rolls_back_the_buffers_when_one_refuses():
    first = TensorDictReplayBuffer(storage=_shared_storage())
    prefetching = TensorDictReplayBuffer(storage=_shared_storage(), batch_size=2, prefetch=1)
    rb = ReplayBufferEnsemble(first, prefetching)
    with pytest.raises(ValueError, match="prefetch=0 or shared=False"):
        rb.share()
    assert not rb.shared and not first.shared and not prefetching.shared


def test_ensemble_with_a_list_storage_refuses_a_process_being_started():
    rbs = [TensorDictReplayBuffer(storage=_shared_storage()),
           TensorDictReplayBuffer(storage=ListStorage(8))]
    rbs[1].extend(_data(2, 3.0))
    rb = ReplayBufferEnsemble(*rbs, batch_size=2)
    with pytest.raises(NotShareableError, match=r"its member 1 \(ListStorage\) cannot"):
        _start("spawn", rb)
    assert len(rbs[1]) == 2 and rb[1] is rbs[1]


def test_ensemble_of_shareable_buffers_pickled_for_a_process_being_started_shares_rows():
    rbs = _buffers(RandomSampler(), RandomSampler())
    rbs[0].extend(_data(2, 1.0))
    rb = ReplayBufferEnsemble(*rbs, shared=True, batch_size=4, sample_from_all=True)
    with _pickling_for_a_process_being_started():
        payload = pickle.dumps(rb)
    other = pickle.loads(payload)
    other[1].extend(_data(3, 5.0))  # written through the copy's buffer
    assert len(rbs[1]) == 3 and rbs[1][:]["obs"].tolist() == [5.0, 5.0, 5.0]
    sample = rb.sample()
    assert sample["index", "buffer_ids"][:, 0].tolist() == [0, 1]
    assert sample["obs"][1].tolist() == [5.0, 5.0]
