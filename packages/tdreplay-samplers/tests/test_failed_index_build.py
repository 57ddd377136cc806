"""A sample whose trajectory index cannot be built changes nothing: the index (and the
resolved signals) stay as they were, so the next sample meets the same error, or, once the
cause is gone, draws exactly what a sampler that never failed draws.

Before the fix, the index consumed its pending writes (and advanced its write counters) before
reading their trajectory ids: after one refused read, every later sample found "no trajectory
to sample from".
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer, testing
from tdreplay.samplers import (
    PrioritizedSliceSampler,
    SliceSampler,
    SliceSamplerWithoutReplacement,
    StreamingSliceSampler,
)
from tdreplay.samplers._trajectory_index import TrajectoryIndex
from tdreplay.storages import LazyTensorStorage

SAMPLERS = {
    "slice": lambda: SliceSampler(slice_len=4, traj_key="episode"),
    "slice_without_replacement": lambda: SliceSamplerWithoutReplacement(
        slice_len=4, traj_key="episode"),
    "prioritized_slice": lambda: PrioritizedSliceSampler(64, alpha=0.7, beta=0.5, slice_len=4,
                                                         traj_key="episode"),
    "streaming_slice": lambda: StreamingSliceSampler(slice_len=4, traj_key="episode"),
}


def _steps(first: int, count: int, episode: torch.Tensor | None = None) -> TensorDict:
    obs = torch.arange(first, first + count)
    return TensorDict({"obs": obs, "episode": obs // 8 if episode is None else episode},
                      [count])


def _buffer(sampler, seed=0):
    return TensorDictReplayBuffer(storage=LazyTensorStorage(64), sampler=sampler, batch_size=16,
                                  generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("make_sampler", SAMPLERS.values(), ids=SAMPLERS.keys())
def test_refused_ids_keep_refusing_the_same_way(make_sampler, ids_stored_unchecked):
    # the reproduction of the bug report (/tmp/h_doc/t4.py), with ids that stay refused
    rb = _buffer(make_sampler())
    rb.extend(_steps(0, 16, episode=torch.arange(16.0) // 8))  # float ids, whole numbers
    rb.sample()
    rb.extend(_steps(16, 8, episode=torch.full((8,), 2.5)))
    before = rb.sampler.state_dict()
    for _ in range(3):  # the same error every time, never "no trajectory to sample from"
        with pytest.raises(ValueError, match="'episode' must hold whole-number"):
            rb.sample()
        testing.assert_same(rb.sampler.state_dict(), before, "sampler state")


def _fail_once(read):
    calls = []

    def flaky(*args):
        if not calls:
            calls.append(True)
            raise OSError("storage not readable right now")
        return read(*args)
    return flaky


WHEN = {
    "first_sample": lambda rb: None,
    "after_writes": lambda rb: (rb.sample(), rb.extend(_steps(32, 40))),  # wraps the ring
    "after_index_assignment": lambda rb: (rb.sample(), rb.__setitem__(3, _steps(3, 1)[0])),
}


@pytest.mark.parametrize("when", WHEN.values(), ids=WHEN.keys())
@pytest.mark.parametrize("make_sampler", SAMPLERS.values(), ids=SAMPLERS.keys())
def test_after_a_failed_build_sampling_goes_on_as_if_nothing_failed(make_sampler, when):
    rb, twin = _buffer(make_sampler()), _buffer(make_sampler())
    for buffer in (rb, twin):
        buffer.extend(_steps(0, 32))
        when(buffer)
    rb.sampler._read_block = _fail_once(rb.sampler._read_block)
    before = rb.sampler.state_dict()
    with pytest.raises(OSError, match="not readable"):
        rb.sample()
    testing.assert_same(rb.sampler.state_dict(), before, "sampler state")
    for buffer in (rb, twin):
        buffer.sampler.generator.manual_seed(1)
    for _ in range(3):
        got, want = rb.sample(), twin.sample()
        assert got["index"].tolist() == want["index"].tolist()
        assert got["obs"].tolist() == want["obs"].tolist()
    testing.assert_same(rb.sampler.state_dict(), twin.sampler.state_dict(), "sampler state")


def test_auto_detected_trajectory_key_is_kept_when_the_build_fails(ids_stored_unchecked):
    sampler = SliceSampler(slice_len=4)  # detects "episode"
    rb = _buffer(sampler)
    rb.extend(_steps(0, 16, episode=torch.full((16,), 0.5)))
    with pytest.raises(ValueError, match="whole-number"):
        rb.sample()
    assert sampler._signals is None and sampler.traj_key == "episode"


# ---- the index itself ----------------------------------------------------------------------------

class _Storage:
    """The least a TrajectoryIndex reads of a storage: a flat ring of ``capacity`` ids."""

    def __init__(self, capacity: int) -> None:
        self.ids = np.zeros(capacity, dtype=np.int64)
        self.length = 0
        self.revision = 0
        self.max_size = self.rows_capacity = capacity
        self.last_written_row = None
        self.shape = None
        self.ndim = 1

    def __len__(self) -> int:
        return self.length

    def write(self, slots: np.ndarray, ids: np.ndarray) -> None:
        self.ids[slots] = ids
        self.length = max(self.length, int(slots.max()) + 1)
        self.revision += 1


def _reader(storage, start, stop):
    return storage.ids[start:stop].copy(), None


def _refusing(storage, start, stop):
    raise ValueError("refused")


@pytest.mark.parametrize("path", ["pending", "rebuild"])
def test_index_sync_is_all_or_nothing(path):
    storage = _Storage(10)
    index, twin = TrajectoryIndex(), TrajectoryIndex()
    storage.write(np.arange(6), np.array([0, 0, 0, 1, 1, 1]))
    for ix in (index, twin):
        ix.note_write(torch.arange(6))
        ix.sync(storage, _reader)
    storage.write(np.arange(6, 10), np.array([1, 2, 2, 2]))
    for ix in (index, twin):
        ix.note_write(torch.arange(6, 10))
        if path == "rebuild":
            ix.note_update()
    before = index.state_dict()
    with pytest.raises(ValueError, match="refused"):
        index.sync(storage, _refusing)
    testing.assert_same(index.state_dict(), before, "index state")
    assert index.pending and index.num_trajectories == 2
    index.sync(storage, _reader)
    twin.sync(storage, _reader)
    testing.assert_same(index.state_dict(), twin.state_dict(), "index state")
    assert index.num_trajectories == 3
    lengths = sorted(index.rec[index.live_records(), 2].tolist())
    assert lengths == [3, 3, 4]
