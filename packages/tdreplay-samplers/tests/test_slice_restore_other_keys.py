"""A slice sampler restored from the checkpoint of one that cut the trajectories by other
entries (``traj_key`` vs ``end_key``) cuts them as it is told to: it saves the entries its
index was built from and, when the restoring sampler resolves others, builds the index again
from the storage. (The restored index was kept: 92-113 of 400 slices crossed a done flag.)"""

from __future__ import annotations

import copy

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.samplers import PrioritizedSliceSampler, SliceSampler, SliceSamplerWithoutReplacement
from tdreplay.storages import LazyTensorStorage

DONE_AT = (4, 10, 17)  # three episodes of 5, 6 and 7 steps, all under one "episode" id


def _data() -> TensorDict:
    done = torch.zeros(18, 1, dtype=torch.bool)
    done[list(DONE_AT)] = True
    return TensorDict({"episode": torch.zeros(18, dtype=torch.long), ("next", "done"): done,
                       "step": torch.arange(18)}, [18])


SAMPLERS = {
    "slice": lambda **kw: SliceSampler(slice_len=3, **kw),
    "without_replacement": lambda **kw: SliceSamplerWithoutReplacement(slice_len=3, **kw),
    "prioritized": lambda **kw: PrioritizedSliceSampler(32, alpha=0.7, beta=0.5, slice_len=3,
                                                         **kw),
}


def _buffer(kind: str, **keys) -> TensorDictReplayBuffer:
    return TensorDictReplayBuffer(storage=LazyTensorStorage(32), batch_size=6,
                                  sampler=SAMPLERS[kind](**keys),
                                  generator=torch.Generator().manual_seed(0))


def _crossing(rb: TensorDictReplayBuffer, samples: int = 60) -> int:
    crossing = 0
    for _ in range(samples):
        for steps in rb.sample()["step"].view(-1, 3).tolist():  # (an epoch may end short)
            crossing += any(step in DONE_AT for step in steps[:-1])
    return crossing


@pytest.mark.parametrize("kind", sorted(SAMPLERS))
@pytest.mark.parametrize("how", ["dumps", "state_dict"])
def test_a_checkpoint_of_other_keys_is_cut_as_the_restoring_sampler_says(kind, how, tmp_path):
    source = _buffer(kind, traj_key="episode")
    source.extend(_data())
    source.sample()  # (the index is built at the first sample)
    restored = _buffer(kind, end_key=("next", "done"))
    if how == "dumps":
        source.dumps(tmp_path / "ckpt")
        restored.loads(tmp_path / "ckpt")
    else:
        restored.load_state_dict(copy.deepcopy(source.state_dict()))
    assert len(restored) == 18
    assert _crossing(restored) == 0


@pytest.mark.parametrize("kind", sorted(SAMPLERS))
def test_a_checkpoint_of_the_same_keys_keeps_its_index_and_samples_as_saved(kind):
    source = _buffer(kind, end_key=("next", "done"))
    source.extend(_data())
    source.sample()
    state = copy.deepcopy(source.state_dict())
    assert state["_sampler"]["index"]["signals"] == [None, [("next", "done")]]
    restored = _buffer(kind, end_key=("next", "done"))
    restored.load_state_dict(state)
    for _ in range(5):
        assert torch.equal(restored.sample()["step"], source.sample()["step"])


def test_a_state_saved_without_signals_loads():
    source = _buffer("slice", end_key=("next", "done"))
    source.extend(_data())
    source.sample()
    state = copy.deepcopy(source.state_dict())
    del state["_sampler"]["index"]["signals"]  # (checkpoints of 0.4.0)
    restored = _buffer("slice", end_key=("next", "done"))
    restored.load_state_dict(state)
    assert _crossing(restored) == 0


@pytest.mark.parametrize("signals", [["episode"], [5, None], ["episode", "done"],
                                     [None, [("next", 3)]], "episode"])
def test_damaged_signals_are_refused_and_nothing_changes(signals):
    source = _buffer("slice", traj_key="episode")
    source.extend(_data())
    source.sample()
    state = copy.deepcopy(source.state_dict())
    state["_sampler"]["index"]["signals"] = signals
    target = _buffer("slice", traj_key="episode")
    target.extend(_data()[:5])
    before = copy.deepcopy(target.sampler.state_dict())
    with pytest.raises(ValueError, match="'signals' must be None or"):
        target.load_state_dict(state)
    assert len(target) == 5
    after = target.sampler.state_dict()
    assert all(torch.equal(before["index"][k], after["index"][k])
               for k in before["index"] if k != "signals")
