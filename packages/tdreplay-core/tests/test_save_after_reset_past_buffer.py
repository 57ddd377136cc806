"""A buffer saved (``state_dict`` / ``dumps``) after its storage was emptied or restored past
it (``rb.storage.empty()``, ``rb.storage.load_state_dict``, as TorchRL programs do) and before
a sample taught the sampler: the saved sampler and writer fit the saved storage, and the
state loads and samples the rows the storage holds."""

from __future__ import annotations

import pytest

from tdreplay.core import ListStorage, ReplayBuffer, SamplerWithoutReplacement


def _buffer(sampler=None) -> ReplayBuffer:
    return ReplayBuffer(storage=ListStorage(8), batch_size=2,
                        sampler=sampler if sampler is not None else SamplerWithoutReplacement())


def _emptied_past(rb: ReplayBuffer) -> ReplayBuffer:
    rb.extend(list(range(6)))
    rb.storage.empty()
    rb.extend([100, 101])
    return rb


def _restored_past(rb: ReplayBuffer) -> ReplayBuffer:
    rb.extend(list(range(6)))
    source = ReplayBuffer(storage=ListStorage(8))
    source.extend([10, 11, 12])
    rb.storage.load_state_dict(source.storage.state_dict())
    return rb


@pytest.mark.parametrize("reset", [_emptied_past, _restored_past])
def test_a_state_saved_after_a_reset_past_the_buffer_loads_and_samples(reset):
    rb = reset(_buffer())
    state = rb.state_dict()
    assert state["_writer"]["cursor"] == len(rb.storage)  # the row the next write goes to
    restored = _buffer()
    restored.load_state_dict(state)
    assert restored[:] == rb[:]
    assert sorted(restored.sample(len(rb))) == sorted(rb[:])  # an epoch: the stored rows
    restored.extend([7])
    assert restored[:] == [*rb[:], 7]


def test_a_dump_after_a_reset_past_the_buffer_loads(tmp_path):
    rb = _restored_past(_buffer())
    rb.dumps(tmp_path / "ckpt")
    restored = _buffer()
    restored.loads(tmp_path / "ckpt")
    assert restored[:] == [10, 11, 12]
    assert sorted(restored.sample(3)) == [10, 11, 12]
