"""Lazy stacks of differently shaped TensorDicts in LazyTensorStorage / LazyMemmapStorage
(TorchRL lays such a storage out as one storage per stacked TensorDict)."""

import pickle

import pytest
import torch
from tensordict import LazyStackedTensorDict, TensorDict

from tdreplay.core import ReplayBuffer, TensorDictReplayBuffer
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage

STORAGES = [LazyTensorStorage, LazyMemmapStorage]


def ragged(n, first=4, second=3, seed=0):
    """A batch of ``n`` items, each a stack of two TensorDicts whose ``"a"`` differ in shape."""
    gen = torch.Generator().manual_seed(seed)
    td1 = TensorDict(a=torch.rand(n, first, 8, generator=gen), b=torch.arange(n), batch_size=n)
    td2 = TensorDict(a=torch.rand(n, second, 8, generator=gen), b=-torch.arange(n),
                     batch_size=n)
    return LazyStackedTensorDict(td1, td2, stack_dim=1)


def assert_same(got, expected):
    assert isinstance(got, LazyStackedTensorDict) and got.stack_dim == expected.stack_dim
    assert got.batch_size == expected.batch_size
    for g, e in zip(got.tensordicts, expected.tensordicts):
        assert set(g.keys(True, True)) == set(e.keys(True, True))
        for key in e.keys(True, True):
            torch.testing.assert_close(g.get(key), e.get(key))


@pytest.mark.parametrize("storage_type", STORAGES)
def test_extend_sample_and_read_back(storage_type):
    rb = ReplayBuffer(storage=storage_type(6), batch_size=3)
    data = ragged(5)
    assert rb.extend(data).tolist() == [0, 1, 2, 3, 4]
    assert len(rb) == 5
    assert_same(rb[:], data)
    sample, info = rb.sample(return_info=True)
    assert sample.batch_size == (3, 2)
    assert sample.tensordicts[0]["a"].shape == (3, 4, 8)
    assert sample.tensordicts[1]["a"].shape == (3, 3, 8)
    assert_same(sample, data[info["index"]])


@pytest.mark.parametrize("storage_type", STORAGES)
def test_ring_wraps_and_other_shapes_are_refused_unchanged(storage_type):
    rb = ReplayBuffer(storage=storage_type(6))
    rb.extend(ragged(5, seed=0))
    more = ragged(3, seed=1)
    assert rb.extend(more).tolist() == [5, 0, 1]
    before = rb[:].tensordicts[1]["a"].clone()
    with pytest.raises(ValueError, match="shape"):
        rb.extend(ragged(2, second=5, seed=2))
    with pytest.raises(ValueError, match="lazy stacks"):  # a dense batch in a ragged storage
        rb.extend(TensorDict(a=torch.zeros(2, 4, 8), b=torch.zeros(2, dtype=torch.long),
                             batch_size=2))
    assert len(rb) == 6 and rb.write_count == 8
    torch.testing.assert_close(rb[:].tensordicts[1]["a"], before)
    assert_same(rb[torch.tensor([5, 0, 1])], more)


@pytest.mark.parametrize("storage_type", STORAGES)
def test_stacked_tensordicts_keep_their_own_keys(storage_type):
    td1 = TensorDict(a=torch.zeros(4, 2), only_first=torch.ones(4), batch_size=4)
    td2 = TensorDict(a=torch.ones(4, 2), batch_size=4)
    data = LazyStackedTensorDict(td1, td2, stack_dim=1)
    storage = storage_type(10)
    storage.set(slice(0, 4), data)
    back = storage[:4]
    assert "only_first" in back.tensordicts[0].keys()
    assert "only_first" not in back.tensordicts[1].keys()
    assert_same(back, data)


def test_a_dense_lazy_stack_is_stored_dense():
    data = LazyStackedTensorDict(TensorDict(a=torch.zeros(3, 2), batch_size=3),
                                 TensorDict(a=torch.ones(3, 2), batch_size=3), stack_dim=1)
    storage = LazyTensorStorage(10)
    storage.set(slice(0, 3), data)
    assert storage.layout_meta()["kind"] == "tensordict"
    assert type(storage[:3]) is TensorDict and storage[:3]["a"].shape == (3, 2, 2)


def test_rows_of_different_shapes_are_still_refused():
    rows = LazyStackedTensorDict(TensorDict(a=torch.zeros(4), batch_size=[]),
                                 TensorDict(a=torch.zeros(3), batch_size=[]), stack_dim=0)
    storage = LazyTensorStorage(10)
    with pytest.raises(RuntimeError):
        storage.set(slice(0, 2), rows)
    assert len(storage) == 0 and not storage.initialized


@pytest.mark.parametrize("storage_type", STORAGES)
def test_add_one_ragged_item(storage_type):
    rb = ReplayBuffer(storage=storage_type(4))
    data = ragged(2)
    with pytest.warns(UserWarning, match="one item with its batch dims"):
        assert rb.add(data[0]) == 0 and rb.add(data[1]) == 1
    assert_same(rb[:], data)


def test_tensordict_buffer_writes_index_into_ragged_samples():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8), batch_size=4)
    data = ragged(6)
    assert rb.extend(data).tolist() == list(range(6))
    assert "index" not in data.tensordicts[0].keys()  # the caller's data as it was
    sample = rb.sample()
    for part in sample.tensordicts:
        assert part["index"].shape == (4,)
        # "b" was written as the row number (negated in the second stacked TensorDict)
        assert part["b"].abs().tolist() == part["index"].tolist()


@pytest.mark.parametrize("storage_type", STORAGES)
def test_state_dict_and_checkpoint_round_trip(storage_type, tmp_path):
    rb = ReplayBuffer(storage=storage_type(6))
    data = ragged(5)
    rb.extend(data)
    restored = ReplayBuffer(storage=storage_type(6))
    restored.load_state_dict(rb.state_dict())
    assert_same(restored[:], data)
    rb.dumps(tmp_path / "ckpt")
    loaded = ReplayBuffer(storage=storage_type(6))
    loaded.loads(tmp_path / "ckpt")
    assert_same(loaded[:], data)
    assert loaded.storage.layout_meta()["kind"] == "lazy_stack"
    with pytest.raises(ValueError, match="shape"):  # the restored storage keeps the shapes
        loaded.extend(ragged(1, first=2))


def test_a_memmap_copy_attaches_the_ragged_layout(tmp_path):
    storage = LazyMemmapStorage(6, scratch_dir=tmp_path)
    data = ragged(5)
    storage.set(slice(0, 5), data)
    copy = pickle.loads(pickle.dumps(storage))  # maps the files from the layout file
    assert_same(copy[:5], data)
    copy.set(5, ragged(1, seed=3)[0])
    assert_same(storage[5:6], ragged(1, seed=3))
