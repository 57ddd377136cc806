"""TorchRL's buffer arguments: compilable=, delayed_init=, transform_factory=, factories."""

from functools import partial

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import (
    ListStorage,
    ListStorageCheckpointer,
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


class _CountingCheckpointer(ListStorageCheckpointer):
    """A list checkpointer that counts its saves (to see which one a buffer's dumps used)."""

    def __init__(self) -> None:
        super().__init__()
        self.saves = 0

    def dumps(self, storage, path):
        self.saves += 1
        super().dumps(storage, path)


@pytest.mark.parametrize("delayed_init", [False, True])
def test_checkpointer_becomes_the_storages_and_writes_its_dumps(tmp_path, delayed_init):
    checkpointer = _CountingCheckpointer()
    rb = ReplayBuffer(storage=ListStorage(5), checkpointer=checkpointer,
                      delayed_init=delayed_init)
    assert rb.initialized is not delayed_init
    assert rb.storage.checkpointer is checkpointer  # (a delayed buffer builds its parts here)
    rb.extend(["a", "b", "c"])
    rb.dumps(tmp_path)
    assert checkpointer.saves == 1
    restored = ReplayBuffer(storage=ListStorage(5))
    restored.loads(tmp_path)
    assert restored[:] == ["a", "b", "c"]


def test_no_checkpointer_keeps_the_one_set_on_the_storage():
    storage = ListStorage(5)
    own = _CountingCheckpointer()
    storage.checkpointer = own
    assert ReplayBuffer(storage=storage).storage.checkpointer is own


@pytest.mark.parametrize("delayed_init", [False, True])
def test_checkpointer_of_the_wrong_kind_is_refused_at_construction(delayed_init):
    storage = ListStorage(5)
    before = storage.checkpointer
    with pytest.raises(TypeError, match="checkpointer must be a StorageCheckpointerBase"):
        ReplayBuffer(storage=storage, checkpointer="flat", delayed_init=delayed_init)
    assert storage.checkpointer is before


@pytest.mark.parametrize("update_priority", [True, False])
def test_update_priority_is_refused_by_a_buffer_that_reads_no_priorities(update_priority):
    rb = ReplayBuffer(storage=ListStorage(5))
    rb.extend([1])
    with pytest.raises(NotImplementedError, match="update_priority"):
        rb.extend([2, 3], update_priority=update_priority)
    assert rb[:] == [1] and rb.write_count == 1
    assert rb.extend([2], update_priority=None).tolist() == [1]
