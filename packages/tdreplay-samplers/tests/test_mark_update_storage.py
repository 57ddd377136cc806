"""``PrioritizedSampler.mark_update(index, storage=...)`` checks ``index`` against the given
storage: a slot not written in it is refused (``IndexError`` naming ``index``), and so is a
``storage`` that is not a :class:`tdreplay.core.Storage` (``TypeError`` naming ``storage``).
Before, both were accepted (the ``storage`` was ignored) and every later sample raised, as the
sampler drew a slot that holds no item. A refused call changes nothing: the sampler's state
and a later seeded sample equal those of a twin that never got the call. Without ``storage``
the call is what it was (the slots are taken as given)."""

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ListStorage, TensorDictReplayBuffer
from tdreplay.samplers import PrioritizedSampler
from tdreplay.storages import LazyTensorStorage


def buffer():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(32),
                                sampler=PrioritizedSampler(32, 0.7, 0.4), batch_size=16)
    rb.extend(TensorDict({"obs": torch.arange(12.0)}, [12]))
    rb.update_priority(torch.arange(12), torch.arange(1.0, 13.0))
    return rb


def same(a, b):
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape \
            and bool(torch.equal(a, b) or torch.equal(a.isnan(), b.isnan())
                     and torch.equal(a.nan_to_num(), b.nan_to_num()))
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    return a == b


def seeded_sample(rb):
    np.random.seed(7)
    torch.manual_seed(7)
    return rb.sample()["obs"]


def assert_unchanged(rb, twin, before):
    assert same(rb.sampler.state_dict(), before)
    assert same(rb.sampler.state_dict(), twin.sampler.state_dict())
    for _ in range(3):
        assert torch.equal(seeded_sample(rb), seeded_sample(twin))


@pytest.mark.parametrize("index", [[20], [12], [31], [3, 20], [40], [-1], [[0, 1], [2, 15]]])
def test_unwritten_slots_refused(index):
    rb, twin = buffer(), buffer()
    before = rb.sampler.state_dict()
    with pytest.raises(IndexError, match=r"\bindex\b.*not written in storage"):
        rb.sampler.mark_update(index=torch.tensor(index), storage=rb.storage)
    assert_unchanged(rb, twin, before)


@pytest.mark.parametrize("storage", ["not a storage", 5, [0, 1], object(),
                                     torch.zeros(12)])
def test_non_storage_refused(storage):
    rb, twin = buffer(), buffer()
    before = rb.sampler.state_dict()
    with pytest.raises(TypeError, match=r"\bstorage\b"):
        rb.sampler.mark_update(index=torch.tensor([0]), storage=storage)
    assert_unchanged(rb, twin, before)


def test_other_storage_is_read():
    """The slots are checked against the storage given, whichever it is."""
    rb, twin = buffer(), buffer()
    other = ListStorage(32)
    other.set(torch.arange(2), ["a", "b"])
    before = rb.sampler.state_dict()
    with pytest.raises(IndexError, match=r"\bindex\b.*\[5\].*2 written slots"):
        rb.sampler.mark_update(torch.tensor([5]), storage=other)
    assert_unchanged(rb, twin, before)
    rb.sampler.mark_update(torch.tensor([1]), storage=other)
    twin.sampler.mark_update(torch.tensor([1]))
    assert_unchanged(rb, twin, twin.sampler.state_dict())


@pytest.mark.parametrize("index", [[3], [0, 11], [], [[1, 2], [3, 4]]])
def test_written_slots_as_without_storage(index):
    rb, twin = buffer(), buffer()
    rb.sampler.mark_update(index=torch.tensor(index, dtype=torch.long), storage=rb.storage)
    twin.sampler.mark_update(torch.tensor(index, dtype=torch.long))
    assert_unchanged(rb, twin, twin.sampler.state_dict())
    if index:  # the max priority (slot 11's)
        first = torch.tensor(index).reshape(-1)[0]
        assert rb.sampler.state_dict()["priorities"][first].item() \
            == rb.sampler.state_dict()["priorities"][11].item()


def test_without_storage_unchanged_behaviour():
    """No storage: the slots are taken as given (the buffer checks them before its call)."""
    sampler = PrioritizedSampler(8, alpha=1.0, beta=1.0, eps=0.0)
    sampler.extend(torch.arange(2))
    sampler.update_priority(torch.arange(2), torch.tensor([1.0, 4.0]))
    sampler.mark_update(torch.tensor([0, 5]), storage=None)
    assert sampler.state_dict()["priorities"].tolist() == [4.0, 4.0, 0, 0, 0, 4.0, 0, 0]
