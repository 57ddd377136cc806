"""A transform added while another thread runs the buffer's transforms: that thread goes on with
the transforms it started with (the list shifted under it: a sample ran a transform twice, an
extend skipped a write-side one and stored rows untransformed)."""

from __future__ import annotations

import threading

import torch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer, Transform
from tdreplay.storages import LazyTensorStorage


def _pausing(inside: threading.Event, go: threading.Event):
    def pause(td):
        inside.set()
        assert go.wait(10)
        return td
    return pause


def test_a_sample_runs_each_transform_once_while_one_is_inserted():
    inside, go = threading.Event(), threading.Event()

    class Counting(Transform):
        def forward(self, td):
            td.set("runs", td.get("runs", torch.zeros(td.shape, dtype=torch.int64)) + 1)
            return _pausing(inside, go)(td)

    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10), batch_size=2)
    rb.extend(TensorDict({"x": torch.arange(10.0)}, [10]))
    rb.append_transform(Counting())
    out = {}
    sampler = threading.Thread(target=lambda: out.setdefault("batch", rb.sample()))
    sampler.start()
    assert inside.wait(10)
    rb.insert_transform(0, lambda td: td)
    go.set()
    sampler.join(10)
    assert out["batch"]["runs"].tolist() == [1, 1]
    assert len(rb.transform) == 2


def test_an_extend_runs_every_write_side_transform_while_one_is_inserted():
    inside, go = threading.Event(), threading.Event()

    def times10(td):
        td["x"] = td["x"] * 10
        return td

    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10), batch_size=2)
    rb.append_transform(times10, invert=True)
    rb.append_transform(_pausing(inside, go), invert=True)
    writer = threading.Thread(target=lambda: rb.extend(TensorDict({"x": torch.ones(3)}, [3])))
    writer.start()
    assert inside.wait(10)
    rb.insert_transform(0, lambda td: td, invert=True)
    go.set()
    writer.join(10)
    assert rb[:3]["x"].tolist() == [10.0, 10.0, 10.0]
