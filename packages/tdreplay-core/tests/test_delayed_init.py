"""delayed_init=True (TorchRL's): the parts are built at the first use of the buffer."""

import copy
import pickle
import threading
from functools import partial

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import (
    ListStorage,
    RandomSampler,
    ReplayBuffer,
    RoundRobinWriter,
    TensorDictReplayBuffer,
)


class Counting:
    """A factory that counts its calls."""

    def __init__(self, make):
        self.make, self.calls = make, 0

    def __call__(self):
        self.calls += 1
        return self.make()


def test_nothing_is_built_before_the_first_use():
    storage = Counting(partial(ListStorage, 6))
    sampler, writer = Counting(RandomSampler), Counting(RoundRobinWriter)
    transform = Counting(lambda: (lambda x: x + 100))
    rb = ReplayBuffer(storage=storage, sampler=sampler, writer=writer,
                      transform_factory=transform, batch_size=2)
    assert not rb.initialized
    assert (storage.calls, sampler.calls, writer.calls, transform.calls) == (0, 0, 0, 0)
    assert "initialized=False" in repr(rb) and not rb.initialized  # repr builds nothing
    rb.extend(torch.arange(8))
    assert rb.initialized
    assert (storage.calls, sampler.calls, writer.calls, transform.calls) == (1, 1, 1, 1)
    assert sorted(int(v) for v in rb.storage[:]) == [2, 3, 4, 5, 6, 7]
    assert all(102 <= int(v) <= 107 for v in rb.sample())
    assert rb.write_count == 8 and len(rb) == 6


@pytest.mark.parametrize("first_use", ["len", "storage", "sample", "state_dict", "add"])
def test_any_first_use_builds_the_parts(first_use):
    rb = ReplayBuffer(storage=partial(ListStorage, 4), delayed_init=True, batch_size=1)
    assert not rb.initialized
    if first_use == "len":
        assert len(rb) == 0
    elif first_use == "storage":
        assert rb.storage.max_size == 4
    elif first_use == "sample":
        with pytest.raises(RuntimeError):  # nothing to sample from (as a built buffer)
            rb.sample()
    elif first_use == "state_dict":
        assert rb.state_dict()["_writer"]["cursor"] == 0
    else:
        assert rb.add(torch.tensor(3)) == 0
    assert rb.initialized


def test_stats_builds_nothing():
    rb = ReplayBuffer(storage=ListStorage(10), delayed_init=True)
    assert rb.stats() == {"size": 0, "write_count": 0, "prefetch_queue_size": 0,
                          "initialized": False, "capacity": 10, "utilization": 0.0}
    assert not rb.initialized
    # a factory's capacity is not known before it runs
    lazy = ReplayBuffer(storage=partial(ListStorage, 10), delayed_init=True)
    assert "capacity" not in lazy.stats() and not lazy.initialized
    rb.extend(torch.arange(3))
    stats = rb.stats()
    assert stats["initialized"] and stats["size"] == 3 and stats["utilization"] == 0.3


def _double(x):
    return x * 2


def _doubling():
    return _double


def test_a_pickled_buffer_builds_its_own_parts():
    rb = ReplayBuffer(storage=partial(ListStorage, 5), transform_factory=_doubling,
                      batch_size=2)
    copy = pickle.loads(pickle.dumps(rb))
    assert not rb.initialized and not copy.initialized
    copy.extend(torch.arange(3))
    assert copy.initialized and not rb.initialized and len(copy) == 3
    assert sorted(copy[:].tolist()) == [0, 2, 4]
    rb.extend(torch.arange(1))
    assert len(rb) == 1 and len(copy) == 3  # separate parts


def test_a_failing_build_leaves_the_buffer_waiting():
    def broken():
        raise RuntimeError("no storage today")

    rb = ReplayBuffer(storage=broken, delayed_init=True)
    for _ in range(2):  # each use tries again and raises the factory's error
        with pytest.raises(RuntimeError, match="no storage today"):
            rb.extend(torch.arange(2))
        assert not rb.initialized


def test_a_part_of_the_wrong_kind_is_refused_at_first_use():
    rb = ReplayBuffer(storage=partial(RandomSampler), delayed_init=True)
    with pytest.raises(TypeError, match="storage"):
        len(rb)
    assert not rb.initialized


def test_threads_share_one_build():
    storage = Counting(partial(ListStorage, 100))
    rb = ReplayBuffer(storage=storage, delayed_init=True)
    barrier = threading.Barrier(4)

    def write(i):
        barrier.wait()
        rb.extend(torch.full((5,), i))

    threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert storage.calls == 1 and len(rb) == 20
    assert sorted(int(v) for v in rb[:]) == sorted([0, 1, 2, 3] * 5)


def test_delayed_tensordict_buffer_with_generator_and_shared_flag():
    gen = torch.Generator().manual_seed(0)
    rb = TensorDictReplayBuffer(storage=partial(ListStorage, 8), delayed_init=True,
                                generator=gen, shared=True, batch_size=3)
    assert rb.shared and not rb.initialized
    td = TensorDict({"x": torch.arange(6)}, [6])
    assert rb.extend(td).tolist() == list(range(6))
    assert rb.sampler.generator is gen  # the generator reached the sampler built late
    first = rb.sample()["index"].tolist()
    gen.manual_seed(0)
    assert rb.sample()["index"].tolist() == first


def test_not_delayed_by_default_without_a_transform_factory():
    assert ReplayBuffer(storage=partial(ListStorage, 3)).initialized
    assert ReplayBuffer(transform_factory=lambda: (lambda x: x), delayed_init=False).initialized


def _class_attributes(obj: object, name: str) -> list[type]:
    return [cls for cls in type(obj).__mro__ if name in vars(cls)]


@pytest.mark.parametrize("delayed", [False, True])
def test_a_built_buffer_reads_its_parts_as_plain_attributes(delayed):
    # no class of a built buffer has an attribute named like a part (even a non-data
    # descriptor would send every read of it through CPython's slow generic lookup)
    rb = TensorDictReplayBuffer(storage=partial(ListStorage, 5), delayed_init=delayed)
    if delayed:
        assert type(rb).__name__ == "TensorDictReplayBuffer" and type(rb) is not TensorDictReplayBuffer
        assert _class_attributes(rb, "_storage") == [type(rb)]
        assert not rb.initialized
    rb.add(TensorDict({"x": torch.zeros(())}, []))
    assert type(rb) is TensorDictReplayBuffer and rb.initialized
    for name in ("_storage", "_sampler", "_writer", "_transform", "_collate_fn"):
        assert _class_attributes(rb, name) == []


@pytest.mark.parametrize("copier", [copy.deepcopy, lambda rb: pickle.loads(pickle.dumps(rb))])
def test_a_copy_of_a_waiting_buffer_waits_and_builds_as_its_own_class(copier):
    rb = ReplayBuffer(storage=partial(ListStorage, 5), delayed_init=True, batch_size=2)
    copied = copier(rb)
    assert not copied.initialized and type(copied) is type(rb)
    copied.extend([1, 2])
    assert type(copied) is ReplayBuffer and copied[:] == [1, 2]
    assert not rb.initialized  # the original still waits
