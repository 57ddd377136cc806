"""Boolean arguments of the samplers and prioritized buffers take a bool (or a numpy bool) and
nothing else: ``"yes"``, ``1``, ``"False"`` (truthy in TorchRL) or ``None`` raise a
``TypeError`` naming the argument before anything is made or changed. ``validate`` (and
``update_priority``) still take ``None`` (the default); ``span``, ``use_gpu`` and ``compile``,
which take more than bools, are not concerned."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer, testing
from tdreplay.core.testing import assert_same, buffer_snapshot
from tdreplay.samplers import (
    PrioritizedReplayBuffer,
    PrioritizedSampler,
    PrioritizedSliceSampler,
    PromptGroupSampler,
    SliceSampler,
    SliceSamplerWithoutReplacement,
    StreamingSliceSampler,
    TensorDictPrioritizedReplayBuffer,
)
from tdreplay.samplers.segment_trees import MinSegmentTree, SumSegmentTree
from tdreplay.storages import LazyTensorStorage

BAD = testing.NOT_BOOLS
BAD_OR_NONE = testing.NOT_BOOLS_OR_NONE
GOOD = testing.BOOLS


def prioritized(**kw: Any) -> PrioritizedSampler:
    return PrioritizedSampler(16, alpha=0.7, beta=0.5, **kw)


def prb(**kw: Any) -> PrioritizedReplayBuffer:
    return PrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=LazyTensorStorage(16), **kw)


def tdprb(**kw: Any) -> TensorDictPrioritizedReplayBuffer:
    return TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=LazyTensorStorage(16),
                                             **kw)


def sliced(**kw: Any) -> SliceSampler:
    kw.setdefault("strict_length", not kw.get("pad_output", False))
    return SliceSampler(slice_len=2, traj_key="episode", **kw)


def sliced_wor(**kw: Any) -> SliceSamplerWithoutReplacement:
    return SliceSamplerWithoutReplacement(slice_len=2, traj_key="episode", **kw)


def prioritized_slices(**kw: Any) -> PrioritizedSliceSampler:
    return PrioritizedSliceSampler(16, alpha=0.7, beta=0.5, slice_len=2, traj_key="episode", **kw)


def streaming(**kw: Any) -> StreamingSliceSampler:
    kw.setdefault("strict_length", not kw.get("pad_output", False))
    return StreamingSliceSampler(slice_len=2, traj_key="episode", **kw)


def fragmented(**kw: Any) -> SliceSampler:
    return SliceSampler(slice_len=2, traj_key="episode", step_key="step", **kw)


# (id, build(**{name: value}), name, read back the flag (None: not kept as such))
CONSTRUCTORS: list[tuple[str, Callable[..., Any], str, Callable[[Any], Any] | None]] = [
    ("PrioritizedSampler", prioritized, "max_priority_within_buffer", lambda s: s._within_buffer),
    ("PrioritizedSampler", prioritized, "stratified", lambda s: s.stratified),
    ("PrioritizedSampler", prioritized, "skip_stale_updates", lambda s: s.skip_stale_updates),
    ("PrioritizedReplayBuffer", prb, "max_priority_within_buffer",
     lambda rb: rb.sampler._within_buffer),
    ("PrioritizedReplayBuffer", prb, "stratified", lambda rb: rb.sampler.stratified),
    ("PrioritizedReplayBuffer", prb, "skip_stale_updates",
     lambda rb: rb.prioritized_sampler.skip_stale_updates),
    ("PrioritizedReplayBuffer", prb, "sync", None),
    ("TensorDictPrioritizedReplayBuffer", tdprb, "stratified",
     lambda rb: rb.prioritized_sampler.stratified),
    ("TensorDictPrioritizedReplayBuffer", tdprb, "sync", None),
    ("SliceSampler", sliced, "cache_values", lambda s: s.cache_values),
    ("SliceSampler", sliced, "strict_length", lambda s: s.strict_length),
    ("SliceSampler", sliced, "pad_output", lambda s: s.pad_output),
    ("SliceSampler", fragmented, "fragmented", None),
    ("SliceSamplerWithoutReplacement", sliced_wor, "drop_last", lambda s: s.drop_last),
    ("SliceSamplerWithoutReplacement", sliced_wor, "shuffle", lambda s: s.shuffle),
    ("SliceSamplerWithoutReplacement", sliced_wor, "strict_length", lambda s: s.strict_length),
    ("SliceSamplerWithoutReplacement", sliced_wor, "cache_values", lambda s: s.cache_values),
    ("PrioritizedSliceSampler", prioritized_slices, "cache_values", lambda s: s.cache_values),
    ("PrioritizedSliceSampler", prioritized_slices, "strict_length", lambda s: s.strict_length),
    ("PrioritizedSliceSampler", prioritized_slices, "max_priority_within_buffer",
     lambda s: s.priorities._within_buffer),
    ("PrioritizedSliceSampler", prioritized_slices, "skip_stale_updates",
     lambda s: s.priorities.skip_stale_updates),
    ("StreamingSliceSampler", streaming, "cache_values", lambda s: s.cache_values),
    ("StreamingSliceSampler", streaming, "strict_length", lambda s: s.strict_length),
    ("StreamingSliceSampler", streaming, "pad_output", lambda s: s.pad_output),
    ("PromptGroupSampler", lambda **kw: PromptGroupSampler(num_groups=2, **kw), "cache_groups",
     lambda s: s.cache_groups),
]
IDS = [f"{c[0]}-{c[2]}" for c in CONSTRUCTORS]


@pytest.mark.parametrize("value", BAD)
@pytest.mark.parametrize("owner, build, name, read", CONSTRUCTORS, ids=IDS)
def test_constructors_refuse_a_flag_that_is_not_a_bool(owner, build, name, read, value):
    testing.assert_flag_refused(build, name, value)


@pytest.mark.parametrize("value", GOOD)
@pytest.mark.parametrize("owner, build, name, read", CONSTRUCTORS, ids=IDS)
def test_constructors_take_bools_and_numpy_bools(owner, build, name, read, value):
    testing.assert_flag_taken(build, name, value, read)


VALIDATE: list[tuple[str, Callable[..., Any]]] = [
    ("PrioritizedSampler", lambda **kw: prioritized(backend="torch", **kw)),
    ("PrioritizedSliceSampler", lambda **kw: prioritized_slices(backend="torch", **kw)),
    ("SumSegmentTree", lambda **kw: SumSegmentTree(8, backend="torch", **kw)),
    ("MinSegmentTree", lambda **kw: MinSegmentTree(8, backend="torch", **kw)),
    ("SumSegmentTree-numba", lambda **kw: SumSegmentTree(8, **kw)),
]


@pytest.mark.parametrize("value", BAD_OR_NONE)
@pytest.mark.parametrize("owner, build", VALIDATE, ids=[v[0] for v in VALIDATE])
def test_validate_refuses_what_is_not_a_bool_or_none(owner, build, value):
    with pytest.raises(TypeError, match="validate must be a bool or None, got"):
        build(validate=value)


@pytest.mark.parametrize("value", [None, True, False, np.bool_(True)])
@pytest.mark.parametrize("owner, build", VALIDATE[:4], ids=[v[0] for v in VALIDATE[:4]])
def test_validate_takes_bools_and_none(owner, build, value):
    build(validate=value)


# ---- sampling as before ------------------------------------------------------------------------
def episodes() -> TensorDict:
    return TensorDict({"episode": torch.tensor([0, 0, 0, 1, 1, 1, 1, 2]),
                       "step": torch.tensor([0, 1, 2, 0, 1, 2, 3, 0]),
                       "obs": torch.arange(8.0)}, [8])


@pytest.mark.parametrize("value", [np.bool_(True), np.bool_(False)])
@pytest.mark.parametrize("build, name", [(sliced, "strict_length"), (sliced_wor, "shuffle"),
                                         (sliced_wor, "drop_last"), (streaming, "pad_output")])
def test_numpy_bools_sample_as_python_bools(build, name, value):
    out = []
    for flag in (value, bool(value)):
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8), sampler=build(**{name: flag}),
                                    batch_size=4)
        rb.extend(episodes())
        torch.manual_seed(0)
        out.append(rb.sample()["obs"].tolist())
    assert out[0] == out[1]


# ---- methods of a filled prioritized buffer: refused, the buffer unchanged ---------------------
def filled_tdprb() -> TensorDictPrioritizedReplayBuffer:
    rb = tdprb(batch_size=3)
    rb.extend(TensorDict({"obs": torch.arange(6.0)}, [6]))
    return rb


@pytest.mark.parametrize("value", BAD_OR_NONE)
def test_extend_refuses_an_update_priority_that_is_not_a_bool_or_none(value):
    rb = filled_tdprb()
    before = buffer_snapshot(rb)
    with pytest.raises(TypeError, match="update_priority must be a bool or None, got"):
        rb.extend(TensorDict({"obs": torch.ones(2), "td_error": torch.ones(2)}, [2]),
                  update_priority=value)
    assert_same(buffer_snapshot(rb), before, "buffer state")


@pytest.mark.parametrize("value", BAD)
def test_sample_refuses_a_return_info_that_is_not_a_bool(value):
    rb = filled_tdprb()
    rb.set_rng(torch.Generator().manual_seed(0))
    expected = rb.sample()["obs"].tolist()
    before = buffer_snapshot(rb)
    with pytest.raises(TypeError, match="return_info must be a bool, got"):
        rb.sample(return_info=value)
    assert_same(buffer_snapshot(rb), before, "buffer state")
    rb.set_rng(torch.Generator().manual_seed(0))
    assert rb.sample()["obs"].tolist() == expected
