"""A tensorclass written as the rows of a ``CompressedListStorage`` (``rb.extend(tc)``,
``rb.add(tc[0])``) is stored as a TensorDict and read back as that class, as the tensor
storages read it (it was refused: "stores tensors, TensorDicts and dicts of tensors"), with
its nested tensorclasses; checkpoints keep the class."""

from __future__ import annotations

import torch
from tensordict import TensorDict, tensorclass

from tdreplay.core import ReplayBuffer
from tdreplay.storages import CompressedListStorage


@tensorclass
class Pos:
    xy: torch.Tensor


@tensorclass
class Step:
    obs: torch.Tensor
    pos: Pos


def steps(n: int, start: int = 0) -> Step:
    obs = torch.arange(start, start + n, dtype=torch.float32)
    return Step(obs=obs, pos=Pos(xy=torch.stack([obs, -obs], -1), batch_size=[n]),
                batch_size=[n])


def test_tensorclass_rows_read_back_as_their_class():
    rb = ReplayBuffer(storage=CompressedListStorage(10), batch_size=3)
    rb.extend(steps(4))
    rb.add(steps(1, start=4)[0])
    stored = rb[:]
    assert type(stored) is Step and type(stored.pos) is Pos
    assert stored.obs.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert torch.equal(stored.pos.xy[:, 1], -stored.obs)
    sample = rb.sample()
    assert type(sample) is Step and torch.equal(sample.pos.xy[:, 0], sample.obs)
    assert type(rb[2]) is Step and rb[2].obs.item() == 2.0


def test_tensorclass_rows_survive_a_checkpoint(tmp_path):
    rb = ReplayBuffer(storage=CompressedListStorage(10))
    rb.extend(steps(3))
    rb.dumps(tmp_path / "ckpt")
    restored = ReplayBuffer(storage=CompressedListStorage(10))
    restored.loads(tmp_path / "ckpt")
    assert type(restored[:]) is Step
    assert torch.equal(restored[:].pos.xy, rb[:].pos.xy)
    via_state = ReplayBuffer(storage=CompressedListStorage(10))
    via_state.load_state_dict(rb.state_dict())
    assert type(via_state[:]) is Step and torch.equal(via_state[:].obs, rb[:].obs)


def test_a_tensordict_with_the_same_entries_stays_a_tensordict():
    storage = CompressedListStorage(4)
    storage.set(torch.arange(2), TensorDict({"obs": torch.zeros(2)}, [2]))
    assert type(storage.get(torch.arange(2))) is TensorDict
