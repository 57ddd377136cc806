"""``rb[index]`` reads of tensor storages are copies taken under the buffer's lock.

TorchRL returns views of a tensor storage for int and slice indices: a later write changes
what was read, a writer thread can leave it half old and half new, and editing it writes to
the storage behind the samplers' back. tdreplay's ``rb[index]`` copies (``rb.storage[index]``
still reads without one); a ``ListStorage`` returns the objects it stores, as TorchRL's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import torch
from tensordict import TensorDict

from tdreplay.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
    ReplayBuffer,
    SliceSampler,
    TensorDictReplayBuffer,
    TensorStorage,
)

STORAGES: dict[str, Callable[[int], object]] = {
    "lazy_tensor": LazyTensorStorage,
    "lazy_memmap": LazyMemmapStorage,
}


def _rows(start: int, n: int) -> TensorDict:
    x = torch.arange(start, start + n, dtype=torch.float32)
    return TensorDict({"a": x, "b": x.clone(), ("nested", "c"): x[:, None].expand(n, 2).clone()},
                      [n])


@pytest.mark.parametrize("storage", sorted(STORAGES))
@pytest.mark.parametrize("index", [slice(None), slice(1, 3), 2, -1, (slice(0, 2),)],
                         ids=["all", "slice", "int", "negative", "tuple"])
def test_read_is_not_changed_by_later_writes(storage, index):
    rb = TensorDictReplayBuffer(storage=STORAGES[storage](4))
    rb.extend(_rows(0, 4))
    read = rb[index]
    expected = read.clone()
    rb.extend(_rows(100, 4))  # overwrites every row
    assert (read == expected).all()
    assert not (rb[index] == expected).any()


@pytest.mark.parametrize("storage", sorted(STORAGES))
def test_editing_a_read_does_not_write_to_the_buffer(storage):
    rb = TensorDictReplayBuffer(storage=STORAGES[storage](4))
    rb.extend(_rows(0, 4))
    read = rb[:]
    read["a"].add_(1000)
    read["nested", "c"].zero_()
    assert rb[:]["a"].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert rb[:]["nested", "c"][:, 0].tolist() == [0.0, 1.0, 2.0, 3.0]
    # the storage itself still reads without a copy, as TorchRL's
    rb.storage[:]["a"].add_(10)
    assert rb[:]["a"].tolist() == [10.0, 11.0, 12.0, 13.0]


def test_plain_tensor_and_pytree_storages_copy():
    rb = ReplayBuffer(storage=TensorStorage(torch.zeros(3)))
    rb.extend(torch.tensor([1.0, 2.0, 3.0]))
    read = rb[:]
    read.add_(5)
    one = rb[0]
    rb.extend(torch.tensor([7.0]))
    assert rb[:].tolist() == [7.0, 2.0, 3.0] and float(one) == 1.0

    tree = ReplayBuffer(storage=LazyTensorStorage(3))
    tree.extend({"x": torch.arange(3.0), "y": (torch.ones(3), torch.zeros(3))})
    read = tree[1:]
    read["x"].add_(100)
    read["y"][0].zero_()
    assert tree[:]["x"].tolist() == [0.0, 1.0, 2.0]
    assert tree[:]["y"][0].tolist() == [1.0, 1.0, 1.0]


def test_list_storage_returns_the_stored_objects():
    rb = ReplayBuffer(storage=ListStorage(3))
    item = TensorDict({"a": torch.zeros(2)}, [])
    rb.add(item)
    assert rb[0] is item


def test_advanced_index_reads_values_once():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(6))
    rb.extend(_rows(0, 6))
    read = rb[torch.tensor([5, 0, 5])]
    assert read["a"].tolist() == [5.0, 0.0, 5.0]
    read["a"].zero_()
    assert rb[:]["a"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_dim_extend_reads_are_copies():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8, ndim=2), dim_extend=1)
    data = TensorDict({"a": torch.arange(8.0).reshape(2, 4)}, [2, 4])  # 2 envs, 4 steps
    rb.extend(data)
    env0 = rb[0]
    assert env0["a"].tolist() == [0.0, 1.0, 2.0, 3.0]
    env0["a"].zero_()
    assert rb[0]["a"].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_edits_through_a_read_cannot_desync_a_slice_sampler():
    # with a view, zeroing a read's trajectory ids would merge trajectories in the storage
    # without the sampler's trajectory index knowing
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8), batch_size=4,
                                sampler=SliceSampler(slice_len=2, traj_key="traj"))
    rb.extend(TensorDict({"traj": torch.tensor([0, 0, 0, 0, 1, 1, 1, 1]),
                          "obs": torch.arange(8.0)}, [8]))
    rb[:]["traj"].zero_()
    assert rb.storage[:]["traj"].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    for _ in range(20):
        sample = rb.sample()
        assert (sample["traj"][0::2] == sample["traj"][1::2]).all()


def test_reads_under_a_concurrent_writer_are_whole():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(64), batch_size=8)
    rb.extend(_rows(0, 64))
    stop = threading.Event()
    errors: list[BaseException] = []

    def write() -> None:
        value = 1
        try:
            while not stop.is_set():
                rows = TensorDict({"a": torch.full((8,), float(value)),
                                   "b": torch.full((8,), float(value)),
                                   ("nested", "c"): torch.full((8, 2), float(value))}, [8])
                rb.extend(rows)
                value += 1
        except BaseException as err:  # noqa: BLE001 - reported by the main thread
            errors.append(err)

    thread = threading.Thread(target=write)
    thread.start()
    try:
        for _ in range(300):
            content = rb[:]
            assert torch.equal(content["a"], content["b"])
            assert torch.equal(content["nested", "c"][:, 1], content["a"])
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not errors
