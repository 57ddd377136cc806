"""TorchRL's buffer arguments: compilable=, delayed_init=, transform_factory=, factories."""

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


@pytest.mark.parametrize("cls", [ReplayBuffer, TensorDictReplayBuffer])
@pytest.mark.parametrize("compilable", [False, True])
def test_compilable_reaches_the_default_parts_and_changes_nothing(cls, compilable):
    rb = cls(batch_size=4, compilable=compilable)
    assert rb.compilable is compilable
    assert rb.storage.compilable is compilable and rb.writer.compilable is compilable
    assert rb.storage.max_size == 1000
    rb.extend(TensorDict({"x": torch.arange(6)}, [6]))
    assert len(rb) == 6 and rb.sample()["x"].shape == (4,)


@pytest.mark.parametrize("name, value", [("compilable", 1), ("delayed_init", "no")])
def test_flags_must_be_bools(name, value):
    with pytest.raises(TypeError, match=name):
        ReplayBuffer(**{name: value})


@pytest.mark.parametrize("delayed_init", [None, False, True])
def test_factories_are_built_now_or_at_first_use(delayed_init):
    seen = []

    def factory():
        seen.append(1)
        return lambda x: x * 10

    rb = ReplayBuffer(storage=partial(ListStorage, 5), sampler=partial(RandomSampler),
                      writer=partial(RoundRobinWriter), transform_factory=factory,
                      delayed_init=delayed_init, batch_size=3)
    delayed = delayed_init is not False  # TorchRL: a transform_factory delays by default
    assert rb.initialized is not delayed and seen == ([] if delayed else [1])
    rb.extend(torch.arange(7))
    assert seen == [1] and rb.initialized
    assert isinstance(rb.storage, ListStorage) and rb.storage.max_size == 5
    assert sorted(int(v) for v in rb.storage[:]) == [2, 3, 4, 5, 6]  # stored as written
    assert sorted(rb[:].tolist()) == [20, 30, 40, 50, 60]  # read through the transform
    assert all(v % 10 == 0 and 20 <= v <= 60 for v in rb.sample().tolist())


def test_transform_and_transform_factory_are_exclusive():
    with pytest.raises(TypeError, match="transform_factory"):
        ReplayBuffer(transform=lambda x: x, transform_factory=lambda: (lambda x: x))
    with pytest.raises(TypeError, match="transform_factory"):
        ReplayBuffer(transform_factory=3)


def test_a_factory_of_the_wrong_kind_is_refused_naming_the_argument():
    with pytest.raises(TypeError, match="storage"):
        ReplayBuffer(storage=partial(RandomSampler))
