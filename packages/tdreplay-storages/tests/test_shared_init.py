"""LazyTensorStorage(shared_init=True) and buffers shared between processes (issue 17)."""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ReplayBuffer, TensorDictReplayBuffer
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage, TensorStorage


def write_worker(rb, worker: int, queue) -> None:
    try:
        rb.extend(TensorDict({"x": torch.full((3,), float(worker))}, [3]))
        queue.put("done")
    except RuntimeError as err:
        queue.put(str(err))


def _run(rb, start_method: str, workers=(1, 2)) -> list[str]:
    ctx = mp.get_context(start_method)
    queue = ctx.Queue()
    procs = [ctx.Process(target=write_worker, args=(rb, w, queue)) for w in workers]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    return [queue.get(timeout=10) for _ in procs]


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
@pytest.mark.parametrize("make", [lambda: LazyTensorStorage(50, shared_init=True),
                                  lambda: LazyMemmapStorage(50, shared_init=True)])
def test_children_lay_out_and_write_the_parent_samples(start_method, make):
    storage = make()
    rb = TensorDictReplayBuffer(storage=storage, batch_size=4).share()
    assert not storage.initialized
    assert _run(rb, start_method) == ["done", "done"]
    assert len(rb) == 6 and rb.write_count == 6
    assert sorted(storage.get(slice(0, 6))["x"].tolist()) == [1.0] * 3 + [2.0] * 3
    sample = rb.sample()
    assert sample["x"].shape == (4,) and set(sample["x"].tolist()) <= {1.0, 2.0}
    rb.extend(TensorDict({"x": torch.zeros(2)}, [2]))  # the parent continues after them
    assert len(rb) == 8 and rb[6:8]["x"].tolist() == [0.0, 0.0]


def test_shared_init_storage_is_a_lazy_tensor_storage_on_cpu():
    storage = LazyTensorStorage(8, device="meta", shared_init=True)
    assert isinstance(storage, LazyTensorStorage) and storage.shared_init
    assert not LazyTensorStorage(8).shared_init
    rb = ReplayBuffer(storage=storage, batch_size=2)
    with pytest.warns(UserWarning, match="cannot be honored"):
        rb.extend(TensorDict({"x": torch.arange(4.0)}, [4]))
    assert storage.device == torch.device("cpu") and rb.sample()["x"].device.type == "cpu"
    with pytest.raises(RuntimeError, match="compilable"):
        LazyTensorStorage(8, shared_init=True, compilable=True)


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_tensor_storage_in_process_memory_refuses_another_process(start_method):
    rb = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=2)
    rb.extend(TensorDict({"x": torch.zeros(2)}, [2]))
    if start_method == "spawn":
        with pytest.raises(RuntimeError, match="Cannot share a storage of type .*LazyTensorStorage"):
            _run(rb, start_method, workers=(1,))
    else:
        (message,) = _run(rb, start_method, workers=(1,))
        assert message.startswith("Cannot share a storage of type")
    assert len(rb) == 2


def test_wrapped_tensor_storage_get_takes_a_slice():
    storage = TensorStorage(torch.arange(6))
    assert storage.get(slice(1, 4)).tolist() == [1, 2, 3]
