"""A prioritized buffer saved after its storage was emptied or restored past it
(``rb.storage.empty()`` / ``rb.storage.load_state_dict``) and before a sample: the saved
priorities are those of the rows the storage holds, so the state loads (it was refused: the
sampler held priorities of slots the storage state did not) and samples only those rows."""

import pytest
import torch

from tdreplay.core import ReplayBuffer
from tdreplay.samplers import PrioritizedSampler
from tdreplay.storages import LazyTensorStorage


def buffer():
    return ReplayBuffer(storage=LazyTensorStorage(8),
                        sampler=PrioritizedSampler(8, alpha=1.0, beta=1.0), batch_size=64)


def emptied_past(rb):
    rb.extend(torch.arange(6))
    rb.storage.empty()
    rb.extend(torch.arange(100, 102))


def restored_past(rb):
    rb.extend(torch.arange(6))
    source = ReplayBuffer(storage=LazyTensorStorage(8))
    source.extend(torch.arange(10, 13))
    rb.storage.load_state_dict(source.storage.state_dict())


@pytest.mark.parametrize("reset", [emptied_past, restored_past])
def test_a_state_saved_after_a_reset_past_the_buffer_loads(reset):
    rb = buffer()
    reset(rb)
    state = rb.state_dict()
    restored = buffer()
    restored.load_state_dict(state)
    assert torch.equal(restored[:], rb[:])
    assert set(restored.sample().tolist()) == set(rb[:].tolist())  # 64 draws, the rows held
    rb.load_state_dict(state)  # (its own state, too)


@pytest.mark.parametrize("reset", [emptied_past, restored_past])
def test_a_dump_after_a_reset_past_the_buffer_loads(reset, tmp_path):
    rb = buffer()
    reset(rb)
    rb.dumps(tmp_path / "ckpt")
    restored = buffer()
    restored.loads(tmp_path / "ckpt")
    assert torch.equal(restored[:], rb[:])
    assert set(restored.sample().tolist()) == set(rb[:].tolist())
