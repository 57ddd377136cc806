"""A priority update from a batch drawn before a restore (``load_state_dict`` / ``loads``)
is skipped, as after ``empty()`` and ``extend``: the restored slots hold other rows. The
restored generations come after every one the sampler gave out (0.6.2 kept the saved ones,
which could equal those of the batch a learner still held)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.samplers import TensorDictPrioritizedReplayBuffer
from tdreplay.storages import LazyTensorStorage


def _buffer() -> TensorDictPrioritizedReplayBuffer:
    return TensorDictPrioritizedReplayBuffer(alpha=1.0, beta=0.5, storage=LazyTensorStorage(20),
                                             batch_size=6,
                                             generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("how", ["load_state_dict", "loads"])
def test_an_update_drawn_before_a_restore_is_skipped(how, tmp_path):
    saved = _buffer()
    saved.extend(TensorDict({"obs": torch.arange(7.0)}, [7]))
    live = _buffer()
    live.extend(TensorDict({"obs": torch.arange(7.0) + 100}, [7]))
    held = live.sample()  # a learner holds it across the restore
    if how == "load_state_dict":
        live.load_state_dict(saved.state_dict())
    else:
        saved.dumps(tmp_path)
        live.loads(tmp_path)
    held["td_error"] = torch.full((6,), 50.0)
    live.update_tensordict_priority(held)
    assert live.sampler.total_priority == pytest.approx(saved.sampler.total_priority)
    fresh = live.sample()  # drawn after the restore: its update applies
    fresh["td_error"] = torch.full((6,), 50.0)
    live.update_tensordict_priority(fresh)
    assert live.sampler.total_priority > saved.sampler.total_priority + 40


def test_a_fresh_buffer_keeps_the_saved_generations():
    saved = _buffer()
    saved.extend(TensorDict({"obs": torch.arange(7.0)}, [7]))
    held = saved.sample()
    restored = _buffer()
    restored.load_state_dict(saved.state_dict())
    assert restored.state_dict()["_sampler"]["write_generation"].tolist() == \
        saved.state_dict()["_sampler"]["write_generation"].tolist()
    held["td_error"] = torch.full((6,), 50.0)  # the saved rows are the rows it drew
    restored.update_tensordict_priority(held)
    assert restored.sampler.total_priority > saved.sampler.total_priority + 40


def test_a_buffer_rolling_back_to_its_own_checkpoints_keeps_small_generations(tmp_path):
    rb = _buffer()
    for _ in range(100):  # each restore moves the generations by one, not by the clock
        rb.extend(TensorDict({"obs": torch.arange(4.0)}, [4]))
        sample = rb.sample()
        sample["td_error"] = torch.rand(6) + 0.1
        rb.update_tensordict_priority(sample)
        rb.dumps(tmp_path)
        rb.loads(tmp_path)
    generations = rb.state_dict()["_sampler"]["write_generation"]
    assert 0 < int(generations.max()) < 1_000
    fresh = _buffer()
    fresh.loads(tmp_path)  # the last checkpoint loads
    held = fresh.sample()
    held["td_error"] = torch.full((6,), 50.0)
    fresh.update_tensordict_priority(held)
    assert fresh.sampler.total_priority > 50
