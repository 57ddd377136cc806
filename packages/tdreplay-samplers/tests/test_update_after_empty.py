"""A priority update with ``write_generation`` made after the buffer was emptied (by another
thread, say: a collector empties while a learner computes its priorities).

Every entry of a sample taken before the ``empty`` is stale: its item is gone, whether its slot
was rewritten since or is unwritten now. Such entries are skipped, as those of rewritten slots
are; the update raised ``IndexError`` ("index points at unwritten slots ... Nothing was
updated"), which dropped the entries still valid with them. Without ``write_generation`` an
index at an unwritten slot is still refused.
"""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.samplers import TensorDictPrioritizedReplayBuffer
from tdreplay.storages import LazyTensorStorage

BACKENDS = ["numba", "torch"]


def _buffer(backend: str) -> TensorDictPrioritizedReplayBuffer:
    return TensorDictPrioritizedReplayBuffer(alpha=1.0, beta=0.5, eps=0.0,
                                             sampler_backend=backend,
                                             storage=LazyTensorStorage(64), batch_size=8)


def _rows(n: int, start: float = 0.0) -> TensorDict:
    return TensorDict({"x": torch.arange(start, start + n)}, [n])


def _leaves(rb: TensorDictPrioritizedReplayBuffer) -> torch.Tensor:
    return rb.prioritized_sampler.state_dict()["priorities"].clone()


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_update_of_a_sample_taken_before_empty_is_skipped(backend: str) -> None:
    rb = _buffer(backend)
    rb.extend(_rows(40))
    old = rb.sample(32)
    assert bool((old["index"] >= 5).any())  # some entries point past the rows written below
    rb.empty()
    rb.extend(_rows(5, 100.0))
    rb.update_priority(torch.arange(5), torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]))
    before = _leaves(rb)
    old["td_error"] = torch.full((32,), 50.0)
    rb.update_tensordict_priority(old)  # raised IndexError ("unwritten slots")
    assert torch.equal(_leaves(rb), before)  # nothing updated: the new rows keep theirs
    assert _leaves(rb)[:5].tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert rb.prioritized_sampler.max_priority == 5.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_update_mixing_stale_and_valid_entries_applies_the_valid_ones(backend: str) -> None:
    rb = _buffer(backend)
    rb.extend(_rows(40))
    old = rb.sample(8)
    rb.empty()
    rb.extend(_rows(5, 100.0))
    new = rb.sample(8)
    index = torch.cat([old["index"], new["index"]])
    generation = torch.cat([old["write_generation"], new["write_generation"]])
    before = _leaves(rb)
    rb.update_priority(index, torch.full((16,), 7.0), write_generation=generation)
    after = _leaves(rb)
    changed = set((after != before).nonzero().flatten().tolist())
    assert changed == set(new["index"].tolist())
    assert after[new["index"]].tolist() == [7.0] * 8
    assert after[5:].abs().sum() == 0  # the slots emptied got nothing


@pytest.mark.parametrize("backend", BACKENDS)
def test_without_write_generation_an_unwritten_slot_is_still_refused(backend: str) -> None:
    rb = _buffer(backend)
    rb.extend(_rows(40))
    old = rb.sample(32)
    rb.empty()
    rb.extend(_rows(5, 100.0))
    before = _leaves(rb)
    with pytest.raises(IndexError, match="unwritten"):
        rb.update_priority(old["index"], torch.full((32,), 50.0))
    with pytest.raises(IndexError, match="unwritten"):
        rb.update_priority(torch.tensor([0, 7]), torch.tensor([2.0, 2.0]))
    # out of range is refused with write generations too (bad input, not a stale entry)
    with pytest.raises(IndexError, match=r"\[0, 64\)"):
        rb.update_priority(torch.tensor([0, 64]), torch.tensor([2.0, 2.0]),
                           write_generation=torch.tensor([2, 2]))
    assert torch.equal(_leaves(rb), before)


def test_an_update_from_before_a_restore_does_not_land_on_rows_written_after_it():
    # save at clock 1, write (clock 2), sample, restore the saved state, write again: the
    # restore does not set the clock back, so the old sample's generations match none of the
    # rows written after it (before, slot 1's new row took the old sample's priority)
    from tdreplay.core import ReplayBuffer
    from tdreplay.samplers import PrioritizedSampler
    from tdreplay.storages import LazyTensorStorage

    rb = ReplayBuffer(storage=LazyTensorStorage(4),
                      sampler=PrioritizedSampler(4, alpha=1.0, beta=1.0))
    rb.extend(torch.arange(1.0, 2.0))
    saved = rb.state_dict()
    rb.extend(torch.arange(2.0, 4.0))
    _, info = rb.sample(16, return_info=True)
    rb.load_state_dict(saved)
    rb.extend(torch.arange(5.0, 8.0))  # slots 1..3 rewritten after the sample
    before = rb.sampler.state_dict()["priorities"][:4].clone()
    rb.sampler.update_priority(info["index"], torch.full((16,), 50.0),
                               write_generation=info["write_generation"])
    after = rb.sampler.state_dict()["priorities"][:4]
    assert torch.equal(after[1:], before[1:])  # the rows written after the sample: untouched
