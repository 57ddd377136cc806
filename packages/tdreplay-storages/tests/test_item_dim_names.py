"""Tensor storages keep the names of an item's own batch dims, as TorchRL's do.

Data of batch size ``[B, T]`` named ``[None, "time"]`` extended into a ``LazyTensorStorage``
reads back (``rb[0]``, ``rb[:2]``, samples) with ``"time"`` on the item dim, the storage's own
dims unnamed; the names come from the first write (later data of other names is written, the
storage's names kept) and survive state dicts, checkpoints, pickling and a memory-mapped
storage attached in another process.
"""

import copy
import json
import multiprocessing as mp
import pickle

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ReplayBuffer
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage, TensorStorage
from tdreplay.storages.memmap_storage import DamagedStorageError

FACTORIES = {
    "lazy_tensor": lambda tmp: LazyTensorStorage(10),
    "consolidated": lambda tmp: LazyTensorStorage(10, consolidated=True),
    "memmap": lambda tmp: LazyMemmapStorage(10, scratch_dir=tmp / "scratch"),
    "shared": lambda tmp: LazyTensorStorage(10, shared_init=True),
}


def named_steps(names=(None, "time")):
    return TensorDict({"obs": torch.arange(12.0).view(3, 4, 1),
                       "nested": TensorDict({"a": torch.ones(3, 4, 2)}, [3, 4])},
                      batch_size=[3, 4], names=list(names))


@pytest.mark.parametrize("kind", sorted(FACTORIES))
def test_reads_and_samples_keep_the_item_dim_names(kind, tmp_path):
    rb = ReplayBuffer(storage=FACTORIES[kind](tmp_path), batch_size=2)
    rb.extend(named_steps())
    sample = rb.sample()
    assert sample.names == [None, "time"]
    assert sample["nested"].names == [None, "time"]
    assert rb[0].names == ["time"]
    assert rb[:2].names == [None, "time"]
    assert rb[torch.tensor([2, 0])].names == [None, "time"]
    assert rb[:2]["obs"].tolist() == named_steps()[:2]["obs"].tolist()


@pytest.mark.parametrize("kind", sorted(FACTORIES))
def test_item_dim_names_survive_state_dicts_checkpoints_and_copies(kind, tmp_path):
    rb = ReplayBuffer(storage=FACTORIES[kind](tmp_path / "a"), batch_size=2)
    rb.extend(named_steps())
    from_state = ReplayBuffer(storage=FACTORIES[kind](tmp_path / "b"), batch_size=2)
    from_state.load_state_dict(rb.state_dict())
    rb.dumps(tmp_path / "ckpt")
    from_files = ReplayBuffer(storage=FACTORIES[kind](tmp_path / "c"), batch_size=2)
    from_files.loads(tmp_path / "ckpt")
    rb.storage.dumps(tmp_path / "storage_ckpt")
    storage_alone = FACTORIES[kind](tmp_path / "d")
    storage_alone.loads(tmp_path / "storage_ckpt")
    for restored in (from_state, from_files, pickle.loads(pickle.dumps(rb)), copy.deepcopy(rb)):
        assert restored.sample().names == [None, "time"]
        assert restored[:]["obs"].tolist() == named_steps()["obs"].tolist()
    assert storage_alone[0].names == ["time"]


def test_the_storage_keeps_the_names_of_its_first_write():
    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    rb.extend(named_steps())
    rb.extend(named_steps((None, None)))
    rb.extend(named_steps(("batch", "other")))
    assert len(rb) == 9
    assert rb[:].names == [None, "time"]
    unnamed_first = ReplayBuffer(storage=LazyTensorStorage(10))
    unnamed_first.extend(named_steps((None, None)))
    unnamed_first.extend(named_steps())
    assert unnamed_first[:].names == [None, None]


def test_the_storage_dims_stay_unnamed():
    rb = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=2)
    rb.extend(named_steps(("batch", "time")))  # (the name of the dim of rows is not kept)
    assert rb.sample().names == [None, "time"]
    two_dims = ReplayBuffer(storage=LazyTensorStorage(12, ndim=2), batch_size=2)
    two_dims.extend(TensorDict({"obs": torch.zeros(2, 3, 4)}, [2, 3, 4],
                               names=["env", "time", "agent"]))
    assert two_dims[:].names == [None, None, "agent"]
    assert two_dims.sample().names == [None, "agent"]


def test_add_of_a_named_item_keeps_its_names():
    rb = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=3)
    rb.add(named_steps()[0])
    assert rb[0].names == ["time"]
    assert rb.sample().names == [None, "time"]


def test_a_wrapped_storage_keeps_the_item_dim_names():
    storage = TensorStorage(named_steps(("rows", "time")))
    assert storage[1].names == ["time"]
    assert storage.get(torch.tensor([0, 2])).names == [None, "time"]


def _sample_names(rb, queue):
    queue.put(rb.sample().names)


def test_a_memmap_storage_attached_in_another_process_keeps_the_names():
    rb = ReplayBuffer(storage=LazyTensorStorage(10, shared_init=True), batch_size=2)
    rb.extend(named_steps())
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_sample_names, args=(rb, queue))
    child.start()
    try:
        assert queue.get(timeout=120) == [None, "time"]
    finally:
        child.join(timeout=60)
    assert child.exitcode == 0


def test_a_damaged_record_of_the_names_is_refused_naming_the_layout(tmp_path):
    storage = LazyMemmapStorage(10, scratch_dir=tmp_path / "scratch", shared_init=True)
    storage.set(slice(0, 3), named_steps())
    layout_file = tmp_path / "scratch" / "tdreplay-memmap-layout.json"
    layout = json.loads(layout_file.read_text())
    assert layout["item_names"] == ["time"]
    layout["item_names"] = ["time", "extra"]
    layout_file.write_text(json.dumps(layout))
    with pytest.raises(DamagedStorageError, match="item_names"):
        pickle.loads(pickle.dumps(storage))[0]
