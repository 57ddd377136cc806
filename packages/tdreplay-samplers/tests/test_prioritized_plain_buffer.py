"""A core TensorDictReplayBuffer driven by a PrioritizedSampler (no prioritized buffer class)."""

import torch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.samplers import PrioritizedSampler
from tdreplay.storages import LazyTensorStorage


def _buffer(capacity: int = 4) -> TensorDictReplayBuffer:
    return TensorDictReplayBuffer(
        storage=LazyTensorStorage(capacity),
        sampler=PrioritizedSampler(capacity, alpha=1.0, beta=1.0),
        batch_size=4,
        generator=torch.Generator().manual_seed(0),
    )


def test_update_tensordict_priority_skips_rows_overwritten_since_the_sample():
    rb = _buffer()
    rb.extend(TensorDict({"obs": torch.arange(4.0)}, [4]))
    sample = rb.sample()
    assert "write_generation" in sample.keys()
    rb.extend(TensorDict({"obs": torch.full((2,), 9.0)}, [2]))  # overwrites slots 0 and 1
    sample["td_error"] = torch.full((4,), 100.0)
    rb.update_tensordict_priority(sample)
    prio = rb.sampler.state_dict()["priorities"]
    slots = sample["index"].tolist()
    stale = [slot for slot in slots if slot in (0, 1)]
    fresh = [slot for slot in slots if slot in (2, 3)]
    assert stale and fresh, "the seeded sample covers both overwritten and untouched slots"
    for slot in stale:
        assert float(prio[slot]) < 100.0, "a stale update reached an overwritten row"
    for slot in fresh:
        assert abs(float(prio[slot]) - 100.0) < 1e-6  # priority + eps

def test_re_extending_a_sample_stores_no_bookkeeping_entries():
    rb = _buffer(8)
    rb.extend(TensorDict({"obs": torch.arange(4.0)}, [4]))
    sample = rb.sample()
    assert {"index", "priority_weight", "write_generation"} <= set(sample.keys())
    rb.extend(sample)
    assert set(rb[:].keys()) == {"obs"}
    assert len(rb) == 8


def test_a_buffer_with_built_trees_pickles_and_samples_the_same():
    import pickle

    rb = _buffer(8)
    rb.extend(TensorDict({"obs": torch.arange(6.0)}, [6]))
    rb.update_priority(torch.arange(6), torch.arange(1.0, 7.0))
    restored = pickle.loads(pickle.dumps(rb))
    assert restored.sampler.state_dict()["priorities"].tolist() == \
        rb.sampler.state_dict()["priorities"].tolist()
    rb.set_rng(torch.Generator().manual_seed(3))
    restored.set_rng(torch.Generator().manual_seed(3))
    assert rb.sample()["index"].tolist() == restored.sample()["index"].tolist()


def test_bad_priorities_in_extended_data_are_refused_before_anything_is_written():
    import pytest

    rb = _buffer(8)
    rb.extend(TensorDict({"obs": torch.arange(3.0)}, [3]))
    before = (len(rb), rb.write_count, rb[:]["obs"].clone(), rb.sampler.state_dict()["priorities"])
    bad = TensorDict({"obs": torch.ones(2), "td_error": torch.tensor([1.0, float("nan")])}, [2])
    with pytest.raises(ValueError):
        rb.extend(bad)
    assert (len(rb), rb.write_count) == before[:2]
    assert torch.equal(rb[:]["obs"], before[2])
    assert torch.equal(rb.sampler.state_dict()["priorities"], before[3])


def test_a_sample_written_back_carries_its_new_rows_generations():
    rb = _buffer(8)
    rb.extend(TensorDict({"obs": torch.arange(4.0)}, [4]))
    sample = rb.sample()
    rb.extend(sample)
    assert torch.equal(sample["write_generation"], rb.sampler.slot_generation(sample["index"]))
    sample["td_error"] = torch.full((4,), 7.0)
    rb.update_tensordict_priority(sample)  # not taken for a stale update
    prio = rb.sampler.state_dict()["priorities"]
    assert all(abs(float(prio[i]) - 7.0) < 1e-6 for i in sample["index"].tolist())
