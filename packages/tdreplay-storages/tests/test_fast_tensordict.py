"""The read path's unchecked TensorDict constructor and the write path's grouped copy: both
probed at import, both equal to the public path they replace, the public path taken when the
probe fails."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ReplayBuffer
from tdreplay.storages import LazyTensorStorage
from tdreplay.storages import _fast_tensordict as fast


def _source() -> dict:
    inner = {"obs": torch.arange(8.0).reshape(4, 2), "done": torch.tensor([0, 1, 0, 1]).bool()}
    return {"action": torch.arange(4), "next": inner}


def _nested(make) -> TensorDict:
    src = _source()
    size = torch.Size([4])
    return make({"action": src["action"], "next": make(src["next"], size, None)}, size, None)


@pytest.fixture(params=["probed", "public"])
def path(request, monkeypatch):
    if request.param == "public":
        monkeypatch.setattr(fast, "_UNCHECKED", None)
        monkeypatch.setattr(fast, "_GROUPED", None)
    return request.param


def test_probes_pass_on_the_pinned_tensordict_and_torch():
    # a tensordict or torch release that changes either fast path fails this test (the buffers
    # would still be right, on the slower public path)
    assert fast.fast_paths_in_use() == (True, True)


def test_new_tensordict_builds_what_the_public_constructor_builds(path):
    built = _nested(fast.new_tensordict)
    expected = TensorDict({"action": _source()["action"],
                           "next": TensorDict(_source()["next"], [4])}, [4])
    assert type(built) is TensorDict and type(built["next"]) is TensorDict
    assert built.batch_size == torch.Size([4]) and built["next"].batch_size == torch.Size([4])
    assert built.device is None
    assert set(built.keys(True, True)) == set(expected.keys(True, True))
    assert (built == expected).all()
    assert built["next", "done"].dtype is torch.bool
    built["next", "obs"] += 1  # an ordinary, writable TensorDict
    assert built["next", "obs"][0].tolist() == [1.0, 2.0]


def test_copy_leaves_copies_and_casts_as_copy(path):
    dst = [torch.zeros(2, 3), torch.zeros(3, dtype=torch.int64), torch.zeros(())]
    src = [torch.arange(6.0).reshape(2, 3), torch.arange(3, dtype=torch.int32), torch.tensor(7.0)]
    fast.copy_leaves(dst, src)
    assert dst[0].tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert dst[1].dtype is torch.int64 and dst[1].tolist() == [0, 1, 2]
    assert dst[2].item() == 7.0
    single = [torch.zeros(2)]
    fast.copy_leaves(single, [torch.ones(2)])
    assert single[0].tolist() == [1.0, 1.0]


def test_buffer_reads_and_writes_the_same_on_either_path(path):
    rb = ReplayBuffer(storage=LazyTensorStorage(8), batch_size=3)
    data = TensorDict({"a": torch.arange(6.0), "n": {"b": torch.arange(6).reshape(6, 1)}}, [6])
    rb.extend(data)
    rb.storage.set(2, TensorDict({"a": torch.tensor(-1.0), "n": {"b": torch.tensor([-2])}}, []))
    got = rb.storage.get(torch.tensor([2, 0, 5]))
    assert got.batch_size == torch.Size([3]) and got["n"].batch_size == torch.Size([3])
    assert got["a"].tolist() == [-1.0, 0.0, 5.0]
    assert got["n", "b"].tolist() == [[-2], [0], [5]]
    got["a"].zero_()  # a sample is a copy: the storage keeps its rows
    assert rb.storage.get(torch.tensor([5]))["a"].tolist() == [5.0]
