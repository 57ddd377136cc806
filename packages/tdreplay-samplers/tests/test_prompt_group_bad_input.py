"""PromptGroupSampler refuses bad input with errors naming the argument, the buffer left as it
was: a ``group_key`` / ``reward_key`` that is not a nested key (before, accepted, failing at
sample), data without the group key (before, "'NoneType' object is not iterable"), NaN or
fractional group ids (before, written and grouped, each NaN a group of its own), and a loaded
``position_recency`` that is None or stamped past ``recency_clock`` (before, accepted)."""

import copy

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ReplayBuffer, TensorDictReplayBuffer
from tdreplay.samplers import PromptGroupSampler
from tdreplay.storages import LazyStackStorage, LazyTensorStorage


@pytest.mark.parametrize("bad", [5, 1.5, None, (), ("a", 2)])
def test_group_key_must_be_a_nested_key(bad):
    with pytest.raises(TypeError, match="group_key"):
        PromptGroupSampler(num_groups=2, group_key=bad)


@pytest.mark.parametrize("strategy", ["reward", "variance"])
@pytest.mark.parametrize("bad", [None, 5, ()])
def test_reward_key_must_be_a_nested_key(strategy, bad):
    with pytest.raises(TypeError, match="reward_key"):
        PromptGroupSampler(num_groups=2, strategy=strategy, reward_key=bad)


@pytest.mark.parametrize("storage", [LazyTensorStorage, LazyStackStorage])
def test_missing_group_key_names_it_at_sample(storage):
    rb = ReplayBuffer(storage=storage(10), batch_size=4,
                      sampler=PromptGroupSampler(num_groups=2, group_key="prompt"))
    rb.extend(TensorDict({"x": torch.arange(6.0)}, [6]))
    before = rb.state_dict()
    with pytest.raises(KeyError, match="group_key 'prompt'"):
        rb.sample()
    after = rb.state_dict()
    assert len(rb) == 6 and after["_writer"] == before["_writer"]
    assert after["_sampler"] == before["_sampler"]


@pytest.mark.parametrize("ids", [[0.0, 0.0, float("nan"), float("nan")], [0.0, 0.0, 1.5, 1.5],
                                 [0.0, float("inf"), 1.0, 1.0]])
def test_non_whole_group_ids_are_refused_at_write(ids):
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10), batch_size=4,
                                sampler=PromptGroupSampler(num_groups=2, group_key="prompt"))
    rb.extend(TensorDict({"x": torch.arange(4.0),
                          "prompt": torch.tensor([0.0, 0.0, 1.0, 1.0])}, [4]))
    before = (len(rb), rb.write_count, rb[:]["prompt"].tolist(), rb[:]["x"].tolist())
    with pytest.raises(ValueError, match="group_key 'prompt'"):
        rb.extend(TensorDict({"x": torch.arange(4.0), "prompt": torch.tensor(ids)}, [4]))
    with pytest.raises(ValueError, match="group_key 'prompt'"):
        bad = next(v for v in ids if not torch.isfinite(torch.tensor(v)) or v % 1)
        rb.add(TensorDict({"x": torch.tensor(1.0), "prompt": torch.tensor(bad)}, []))
    assert (len(rb), rb.write_count, rb[:]["prompt"].tolist(), rb[:]["x"].tolist()) == before
    assert rb.sample().batch_size == torch.Size([4])


def recency_buffer():
    rb = ReplayBuffer(storage=LazyStackStorage(20), batch_size=4,
                      sampler=PromptGroupSampler(num_groups=2, group_key="q",
                                                 strategy="recency"))
    rb.extend(TensorDict({"q": torch.arange(6) % 2, "x": torch.arange(6.0)}, [6]))
    rb.sample()
    return rb


@pytest.mark.parametrize("bad", [None, torch.arange(100), torch.full((6,), 50)])
def test_bad_position_recency_is_refused(bad):
    rb = recency_buffer()
    state = rb.state_dict()
    before = copy.deepcopy(state["_sampler"])
    sd = copy.deepcopy(state)
    sd["_sampler"]["position_recency"] = bad
    with pytest.raises(ValueError, match="position_recency"):
        rb.load_state_dict(sd)
    after = rb.state_dict()["_sampler"]
    assert torch.equal(after["position_recency"], before["position_recency"])
    assert after["recency_clock"] == before["recency_clock"]


def test_a_saved_recency_state_still_loads():
    rb = recency_buffer()
    rb.extend(TensorDict({"q": torch.tensor([0, 1]), "x": torch.zeros(2)}, [2]))
    state = rb.state_dict()
    other = copy.deepcopy(rb)
    other.load_state_dict(state)
    assert torch.equal(other.state_dict()["_sampler"]["position_recency"],
                       state["_sampler"]["position_recency"])
