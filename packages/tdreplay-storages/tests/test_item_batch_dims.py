"""Items keep their own batch dims in every storage, as TorchRL (issue 16).

``rb.add(td)`` of a TensorDict of batch size ``[10]`` stores one item of batch size ``[10]``:
``rb[0]`` reads ``[10]``, a sample of 1 is ``[1, 10]``, ``extend([td])`` stores ``[1, 10]``.
"""

import pickle
import warnings

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ListStorage, ReplayBuffer, TensorDictReplayBuffer
from tdreplay.storages import (
    CompressedListStorage,
    LazyMemmapStorage,
    LazyStackStorage,
    LazyTensorStorage,
    TensorStorage,
)

FACTORIES = {
    "list": lambda: ListStorage(8),
    "lazy_tensor": lambda: LazyTensorStorage(8),
    "memmap": lambda: LazyMemmapStorage(8),
    "lazy_stack": lambda: LazyStackStorage(8),
    "compressed": lambda: CompressedListStorage(8),
}


def traj(start, steps=10):
    return TensorDict({"obs": torch.arange(start, start + steps, dtype=torch.float32),
                       ("next", "obs"): torch.arange(start + 1, start + steps + 1.0)}, [steps])


@pytest.mark.parametrize("kind", sorted(FACTORIES))
def test_add_of_a_batched_tensordict_keeps_its_batch_dims(kind):
    rb = ReplayBuffer(storage=FACTORIES[kind]())
    assert rb.add(traj(0)) == 0
    rb.add(traj(100))
    assert rb[0].batch_size == (10,)
    assert rb[1]["obs"].tolist() == list(range(100, 110))
    sample = rb.sample(1)
    assert sample.batch_size == (1, 10)
    assert sample["obs"][0, 0].item() in (0.0, 100.0)
    assert torch.equal(sample["next", "obs"], sample["obs"] + 1)


@pytest.mark.parametrize("kind", sorted(FACTORIES))
def test_extend_of_a_list_of_one_tensordict_is_one_item_with_its_batch_dims(kind):
    rb = ReplayBuffer(storage=FACTORIES[kind]())
    assert rb.extend([traj(0)]).tolist() == [0]
    assert len(rb) == 1
    assert rb[:].batch_size == (1, 10)
    assert rb.sample(3).batch_size == (3, 10)


def test_tensordict_buffer_samples_carry_the_index_over_the_item():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8), batch_size=2)
    td = traj(0)
    assert rb.add(td) == 0
    assert "index" not in td.keys()  # the caller's item as it was
    sample = rb.sample()
    assert sample.batch_size == (2, 10)
    assert sample["index"].shape == (2, 10) and (sample["index"] == 0).all()


def test_extend_of_a_2d_batch_into_a_1d_storage_keeps_the_second_dim():
    rb = ReplayBuffer(storage=LazyTensorStorage(8))
    rb.extend(torch.stack([traj(0), traj(100), traj(200)]))  # [3, 10], ndim=1: 3 items
    assert len(rb) == 3
    assert rb[2].batch_size == (10,) and rb[2]["obs"][0].item() == 200.0
    assert rb.sample(4).batch_size == (4, 10)


def test_wrapped_storage_keeps_its_trailing_batch_dims():
    data = torch.stack([traj(10 * i) for i in range(4)])  # [4, 10]
    storage = TensorStorage(data)
    assert storage.shape == (4,) and len(storage) == 4
    assert storage.get(torch.tensor([3, 1])).batch_size == (2, 10)


@pytest.mark.parametrize("make", [lambda d: LazyTensorStorage(8),
                                  lambda d: LazyMemmapStorage(8, scratch_dir=d)],
                         ids=["lazy_tensor", "memmap"])
def test_item_batch_dims_survive_checkpoints_and_state_dicts(tmp_path, make):
    rb = ReplayBuffer(storage=make(tmp_path / "a"))
    rb.add(traj(0))
    rb.add(traj(100))
    rb.dumps(tmp_path / "ckpt")
    loaded = ReplayBuffer(storage=make(tmp_path / "b"))
    loaded.loads(tmp_path / "ckpt")
    assert loaded[:].batch_size == (2, 10)
    assert loaded[1]["obs"].tolist() == list(range(100, 110))
    restored = ReplayBuffer(storage=make(tmp_path / "c"))
    restored.load_state_dict(rb.state_dict())
    assert restored.sample(3).batch_size == (3, 10)
    restored.add(traj(200))
    assert restored[2]["next", "obs"][-1].item() == 210.0


def test_memmap_storage_attached_elsewhere_keeps_item_batch_dims(tmp_path):
    storage = LazyMemmapStorage(8, scratch_dir=tmp_path / "scratch")
    rb = ReplayBuffer(storage=storage)
    rb.add(traj(0))
    copy = pickle.loads(pickle.dumps(storage))  # maps the same files, layout read from disk
    assert copy.get(torch.tensor([0])).batch_size == (1, 10)
    assert copy[0]["obs"].tolist() == list(range(10))


def test_an_item_of_another_batch_shape_is_refused_and_nothing_changes():
    rb = ReplayBuffer(storage=LazyTensorStorage(8))
    rb.add(traj(0))
    with pytest.raises(ValueError, match="shape"):
        rb.add(traj(0, steps=5))
    assert len(rb) == 1 and rb.write_count == 1


@pytest.mark.parametrize("make", [ReplayBuffer, TensorDictReplayBuffer])
def test_add_of_one_step_of_every_environment_to_an_ndim2_storage_does_not_warn(make):
    # one row of an ndim=2 storage is a step of every environment: added as it should be, it
    # was told to use extend(), which refuses it (dim_extend=1, one batch dim)
    rb = make(storage=LazyTensorStorage(12, ndim=2))
    rb.extend(TensorDict({"t": torch.zeros(3, 2)}, [3, 2]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        slots = rb.add(TensorDict({"t": torch.ones(3)}, [3]))
    assert slots.tolist() == [6, 7, 8] and rb.storage[2]["t"].tolist() == [1.0, 1.0, 1.0]
    # more dims than a row: warned (then refused: rows hold [3] steps of no dims of their own)
    with pytest.warns(UserWarning, match="stores it as one item"), pytest.raises(ValueError):
        rb.add(TensorDict({"t": torch.ones(3, 2)}, [3, 2]))
    assert len(rb) == 9
