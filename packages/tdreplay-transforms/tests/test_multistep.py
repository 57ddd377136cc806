"""MultiStep against a step-by-step reference; done/terminated/truncated; shapes; errors."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from tdreplay.transforms import MultiStep


def make_td(batch, T, seed, p_term=0.15, p_trunc=0.1):
    g = torch.Generator().manual_seed(seed)
    shape = (*batch, T)
    terminated = torch.rand(*shape, 1, generator=g) < p_term
    truncated = (torch.rand(*shape, 1, generator=g) < p_trunc) & ~terminated
    return TensorDict({
        "obs": torch.randn(*shape, 2, generator=g),
        "action": torch.randn(*shape, 1, generator=g),
        ("next", "obs"): torch.randn(*shape, 2, generator=g),
        ("next", "reward"): torch.randn(*shape, 1, generator=g),
        ("next", "terminated"): terminated,
        ("next", "truncated"): truncated,
        ("next", "done"): terminated | truncated,
    }, list(shape))


def reference(td, gamma, n):
    """Per-sequence loop: returns reward, next obs, next terminated, steps, gamma ([T] each)."""
    T = td.shape[-1]
    end = td["next", "done"][..., 0]
    reward = td["next", "reward"][..., 0]
    out = {"reward": [], "obs": [], "terminated": [], "truncated": [], "steps": [], "gamma": []}
    for t in range(T):
        e = t
        while e < T - 1 and not end[e]:
            e += 1
        m = min(n, e - t + 1)
        out["reward"].append(sum(gamma ** k * reward[t + k] for k in range(m)))
        out["obs"].append(td["next", "obs"][t + m - 1])
        out["terminated"].append(td["next", "terminated"][t + m - 1, 0])
        out["truncated"].append(td["next", "truncated"][t + m - 1, 0])
        out["steps"].append(m)
        out["gamma"].append(gamma ** m)
    return out


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 5), T=st.integers(1, 10), B=st.integers(1, 3),
       gamma=st.sampled_from([1.0, 0.9, 0.5]), seed=st.integers(0, 10_000))
def test_matches_reference(n, T, B, gamma, seed):
    td = make_td([B], T, seed)
    original = td.clone()
    out = MultiStep(gamma, n)(td)
    assert out.batch_size == (B, T)
    assert out["next", "reward"].shape == (B, T, 1)
    # as TorchRL's: the batch shape (the done entry's trailing singleton dropped)
    assert out["steps_to_next_obs"].shape == (B, T)
    assert out["steps_to_next_obs"].dtype == torch.long
    assert out["gamma"].shape == (B, T)
    assert torch.equal(out["next", "original_reward"], original["next", "reward"])
    assert torch.equal(out["obs"], original["obs"]) and torch.equal(out["action"],
                                                                    original["action"])
    for b in range(B):
        ref = reference(original[b], gamma, n)
        assert torch.allclose(out["next", "reward"][b, :, 0], torch.stack(ref["reward"]),
                              atol=1e-5)
        assert torch.equal(out["next", "obs"][b], torch.stack(ref["obs"]))
        assert out["next", "terminated"][b, :, 0].tolist() == [bool(x) for x in ref["terminated"]]
        assert out["next", "truncated"][b, :, 0].tolist() == [bool(x) for x in ref["truncated"]]
        assert out["steps_to_next_obs"][b].tolist() == ref["steps"]
        assert torch.allclose(out["gamma"][b], torch.tensor(ref["gamma"]))


def test_worked_example_with_termination_inside_the_window():
    td = TensorDict({
        ("next", "obs"): torch.arange(1.0, 7.0),
        ("next", "reward"): torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
        ("next", "terminated"): torch.tensor([False, False, True, False, False, False]),
    }, [6])
    out = MultiStep(0.5, 3)(td)
    assert out["next", "reward"].tolist() == [1 + 1 + 0.75, 2 + 1.5, 3, 4 + 2.5 + 1.5, 5 + 3, 6]
    assert out["next", "obs"].tolist() == [3.0, 3.0, 3.0, 6.0, 6.0, 6.0]
    # steps 0 and 1 see the termination at step 2: no bootstrapping from the terminal state
    assert out["next", "terminated"].tolist() == [True, True, True, False, False, False]
    assert out["steps_to_next_obs"].tolist() == [3, 2, 1, 3, 2, 1]
    assert out["gamma"].tolist() == [0.125, 0.25, 0.5, 0.125, 0.25, 0.5]


def test_one_step_is_the_identity_on_rewards_and_next_states():
    td = make_td([2], 5, 3)
    original = td.clone()
    out = MultiStep(0.9, 1)(td)
    assert torch.equal(out["next", "reward"], original["next", "reward"])
    assert torch.equal(out["next", "obs"], original["next", "obs"])
    assert out["steps_to_next_obs"].eq(1).all()
    assert torch.allclose(out["gamma"], torch.full_like(out["gamma"], 0.9))


def test_multi_agent_reward_and_custom_keys():
    T = 4
    td = TensorDict({
        ("next", "agents", "reward"): torch.ones(T, 3),  # one reward per agent
        ("next", "end"): torch.tensor([False, True, False, False]),
        ("next", "obs"): torch.arange(T + 0.0),
    }, [T])
    out = MultiStep(1.0, 2, reward_keys=[("agents", "reward")], done_keys="end")(td)
    assert out["next", "agents", "reward"].tolist() == [[2.0] * 3, [1.0] * 3, [2.0] * 3,
                                                        [1.0] * 3]
    assert ("next", "agents", "original_reward") in out.keys(True, True)
    assert out["next", "obs"].tolist() == [1.0, 1.0, 3.0, 3.0]
    assert out["steps_to_next_obs"].shape == (T,)


def test_errors():
    td = make_td([], 4, 0)
    with pytest.raises(KeyError, match="reward"):
        MultiStep(0.9, 2)(td.exclude(("next", "reward")))
    with pytest.raises(KeyError, match="done"):
        MultiStep(0.9, 2)(td.exclude(("next", "done"), ("next", "terminated"),
                                     ("next", "truncated")))
    bad = td.clone()
    bad.batch_size = []
    with pytest.raises(ValueError, match="time dimension"):
        MultiStep(0.9, 2)(bad)
    with pytest.raises(ValueError, match="gamma"):
        MultiStep(1.5, 2)
    with pytest.raises(ValueError, match="n_steps"):
        MultiStep(0.9, 0)
    with pytest.raises(TypeError, match="MultiStep"):
        MultiStep(0.9, 2)([1, 2])
