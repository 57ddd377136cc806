"""Floating trajectory ids: whole numbers are ids (cast exactly to int64), as in TorchRL's own
examples (``"episode": torch.zeros(100)``); other values are refused, naming the key, before
the sampler changes."""

from __future__ import annotations

import math
import re

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
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage

SAMPLERS = {
    "slice": lambda: SliceSampler(slice_len=5, traj_key="episode", strict_length=False),
    "slice_without_replacement": lambda: SliceSamplerWithoutReplacement(
        slice_len=5, traj_key="episode", strict_length=False),
    "prioritized_slice": lambda: PrioritizedSliceSampler(
        1000, alpha=0.7, beta=0.5, slice_len=5, traj_key="episode", strict_length=False),
    "streaming_slice": lambda: StreamingSliceSampler(slice_len=5, traj_key="episode",
                                                     strict_length=False),
}


def _buffer(sampler, seed=0):
    return TensorDictReplayBuffer(storage=LazyTensorStorage(1000), sampler=sampler,
                                  generator=torch.Generator().manual_seed(seed))


def _episodes(dtype):
    """TorchRL's SliceSampler docstring data: 100 steps of episode 0, then 4 of episode 1."""
    return [TensorDict({"obs": torch.arange(100), "episode": torch.zeros(100, dtype=dtype)},
                       [100]),
            TensorDict({"obs": torch.arange(4), "episode": torch.ones(4, dtype=dtype)}, [4])]


def test_torchrl_docstring_example(tmp_path):
    # TorchRL 0.14.1's SliceSampler example: float32 episode ids, 10 slices of 5 steps
    rb = TensorDictReplayBuffer(
        storage=LazyMemmapStorage(1_000_000, scratch_dir=tmp_path),
        sampler=SliceSampler(cache_values=True, num_slices=10), batch_size=320,
        generator=torch.Generator().manual_seed(0))
    done = torch.zeros(100, 1, dtype=torch.bool)
    done[-1] = True
    data = TensorDict({"observation": torch.randn(100, 45), "action": torch.randn(100, 6),
                       "episode": torch.zeros(100),
                       "next": {"observation": torch.randn(100, 45), "done": done}}, [100])
    rb.extend(data)
    sample = rb.sample(50)
    assert sample.shape == (50,)
    assert rb.sampler.traj_key == "episode"
    slots = sample["index"].view(10, 5)
    assert bool((slots.diff(dim=1) == 1).all()) and int(slots.max()) < 100
    assert sample["episode"].dtype is torch.float32  # the data is returned as stored
    truncated = sample["next", "truncated"].view(10, 5)
    assert truncated[:, -1].all() and not truncated[:, :-1].any()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("make_sampler", SAMPLERS.values(), ids=SAMPLERS.keys())
def test_whole_float_ids_sample_as_integer_ids(make_sampler, dtype):
    rb, twin = _buffer(make_sampler()), _buffer(make_sampler())
    for a, b in zip(_episodes(dtype), _episodes(torch.int64)):
        rb.extend(a)
        twin.extend(b)
    for _ in range(3):
        got, want = rb.sample(50), twin.sample(50)
        assert got["index"].tolist() == want["index"].tolist()
        assert got["next", "truncated"].tolist() == want["next", "truncated"].tolist()
        # slices never mix the two episodes
        ends = torch.nonzero(got["next", "truncated"].view(-1)).view(-1).tolist()
        for a, b in zip([-1, *ends[:-1]], ends):
            assert len(set(got["episode"][a + 1: b + 1].tolist())) == 1


def test_large_whole_float64_ids_are_cast_exactly():
    ids = torch.tensor([2.0 ** 60] * 4 + [2.0 ** 60 + 256] * 4, dtype=torch.float64)
    rb = _buffer(SliceSampler(slice_len=4, traj_key="episode"))
    rb.extend(TensorDict({"episode": ids}, [8]))
    starts = rb.sample(40)["index"].view(10, 4)[:, 0]
    assert set(starts.tolist()) == {0, 4}  # two trajectories of 4 steps


BAD_IDS = {"half": 0.5, "nan": math.nan, "inf": math.inf, "beyond_int64": 2.0 ** 64}


@pytest.mark.parametrize("bad", BAD_IDS.values(), ids=BAD_IDS.keys())
@pytest.mark.parametrize("make_sampler", SAMPLERS.values(), ids=SAMPLERS.keys())
def test_ids_that_are_not_whole_numbers_are_refused(make_sampler, bad):
    message = re.escape(
        f"trajectory key 'episode' must hold whole-number trajectory ids: found {bad!r}")
    rb = _buffer(make_sampler())
    good = TensorDict({"obs": torch.arange(10),
                       "episode": torch.zeros(10, dtype=torch.float64)}, [10])
    rb.extend(good)
    episode = torch.zeros(10, dtype=torch.float64)
    episode[7] = bad
    data = TensorDict({"obs": torch.arange(10), "episode": episode}, [10])
    before = rb.state_dict()
    # refused before anything is written (stored, they made every later sample raise)
    for write in (lambda: rb.extend(data), lambda: rb.add(data[7]),
                  lambda: rb.__setitem__(slice(0, 10), data)):
        with pytest.raises(ValueError, match=message):
            write()
        testing.assert_same(rb.state_dict(), before, "buffer state")
    assert len(rb.sample(10)) > 0  # the buffer samples as before
    # written past the buffer (straight into the storage): the next sample refuses them
    rb.storage.set(torch.arange(10, 20), data)
    before = rb.sampler.state_dict()
    with pytest.raises(ValueError, match=message):
        rb.sample(10)
    testing.assert_same(rb.sampler.state_dict(), before, "sampler state")


def test_static_float_trajectories():
    whole = torch.tensor([0.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    rb = _buffer(SliceSampler(slice_len=3, trajectories=whole))
    rb.extend(TensorDict({"obs": torch.arange(6)}, [6]))
    assert set(rb.sample(30)["index"].view(10, 3)[:, 0].tolist()) == {0, 3}
    with pytest.raises(ValueError, match="trajectories must hold whole-number trajectory ids: "
                                         "found 0.5"):
        SliceSampler(slice_len=3, trajectories=torch.tensor([0.0, 0.5]))
    with pytest.raises(TypeError, match="trajectories must hold integer trajectory ids"):
        SliceSampler(slice_len=3, trajectories=torch.tensor([True, False]))
