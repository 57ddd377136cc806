"""RemoteTensorDictReplayBuffer: a TensorDict buffer locally, and over torch.distributed.rpc."""

from __future__ import annotations

import pickle
import socket
import subprocess
import sys

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ListStorage, TensorDictReplayBuffer
from tdreplay.distributed import RemoteTensorDictReplayBuffer
from tdreplay.storages import LazyTensorStorage


def test_locally_it_is_a_tensordict_buffer():
    rb = RemoteTensorDictReplayBuffer(storage=LazyTensorStorage(10), batch_size=4)
    assert isinstance(rb, TensorDictReplayBuffer)
    assert rb.add(TensorDict({"a": torch.tensor([1])}, [])) == 0
    assert rb.extend(TensorDict({"a": torch.arange(3).unsqueeze(-1)}, [3])).tolist() == [1, 2, 3]
    sample, info = rb.sample(return_info=True)
    assert sample.batch_size == torch.Size([4]) and "index" in info
    rb.empty()
    assert len(rb) == 0


def test_sample_takes_torchrls_positional_order():
    # (TorchRL's order for this class is (batch_size, include_info, return_info): the second
    # positional argument was return_info here, so sample(3, True) gave a tuple)
    rb = RemoteTensorDictReplayBuffer(storage=LazyTensorStorage(10))
    rb.extend(TensorDict({"a": torch.arange(4)}, [4]))
    with pytest.warns(DeprecationWarning, match="include_info is ignored"):
        batch = rb.sample(3, True)
    assert isinstance(batch, TensorDict) and batch.batch_size == torch.Size([3])
    batch, info = rb.sample(3, None, True)
    assert batch["a"].shape == (3,) and info["index"].shape == (3,)


def test_its_methods_pickle_by_reference_to_the_class():
    """RPC sends the function: it must come back as the RRef-accepting method."""
    for name in ("add", "extend", "sample", "update_priority", "update_tensordict_priority"):
        method = getattr(RemoteTensorDictReplayBuffer, name)
        assert pickle.loads(pickle.dumps(method)) is method
        assert method is not getattr(TensorDictReplayBuffer, name)


RPC = r"""
import torch, torch.distributed.rpc as rpc
from tensordict import TensorDict
from tdreplay.core import ListStorage
from tdreplay.distributed import RemoteTensorDictReplayBuffer

class Node(RemoteTensorDictReplayBuffer):
    def __init__(self, capacity):
        super().__init__(storage=ListStorage(capacity))

rpc.init_rpc("BUFFER", rank=0, world_size=1, rpc_backend_options=rpc.TensorPipeRpcBackendOptions(
    init_method="tcp://127.0.0.1:{port}", num_worker_threads=4))
rref = rpc.remote("BUFFER", Node, args=(100,))
td = TensorDict({"a": torch.tensor([7])}, [])
index = rpc.rpc_sync(rref.owner(), Node.add, args=(rref, td))
sampled = rpc.rpc_sync(rref.owner(), Node.sample, args=(rref, 1))
assert type(index) is int and index == 0, index
assert type(sampled) is TensorDict and sampled["a"].tolist() == [[7]], sampled
rpc.shutdown()
print("rpc ok")
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(not torch.distributed.rpc.is_available(), reason="torch without RPC")
def test_called_over_rpc_with_its_rref():
    out = subprocess.run([sys.executable, "-c", RPC.replace("{port}", str(_free_port()))],
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "rpc ok" in out.stdout


def test_list_storage_buffer():
    rb = RemoteTensorDictReplayBuffer(storage=ListStorage(5))
    rb.add(TensorDict({"a": torch.tensor([1])}, []))
    assert len(rb) == 1
