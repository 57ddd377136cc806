"""HERReplayBuffer and HindsightStrategy: which goals are relabelled, from which steps (within
trajectories, across the wrap of a full ring), rewards recomputed, bad input, state round
trips."""

import math
import tempfile

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import HERReplayBuffer, HindsightStrategy, ListStorage, TensorDictReplayBuffer
from tdreplay.core.testing import StackedListStorage


def _steps(ids, done_at=(), goal_dim=2):
    """Transitions whose achieved goals are their step ids (all goal entries), desired -1."""
    n = len(ids)
    done = torch.zeros(n, 1, dtype=torch.bool)
    done[list(done_at)] = True
    achieved = torch.tensor(list(ids), dtype=torch.float32)[:, None].expand(n, goal_dim).clone()
    desired = torch.full((n, goal_dim), -1.0)
    return TensorDict({
        "observation": torch.randn(n, 3), "desired_goal": desired, "achieved_goal": achieved,
        "next": {"desired_goal": desired.clone(), "achieved_goal": achieved.clone(),
                 "reward": torch.full((n, 1), -99.0), "done": done},
    }, [n])


def _reached(td):
    return (td["achieved_goal"] == td["desired_goal"]).all(-1, keepdim=True).float()


def _buffer(capacity=100, batch_size=64, seed=0, storage=None, **kwargs):
    kwargs.setdefault("reward_fn", _reached)
    return HERReplayBuffer(storage=storage if storage is not None else StackedListStorage(capacity),
                           batch_size=batch_size, generator=torch.Generator().manual_seed(seed),
                           **kwargs)


def _pairs(rb, batch_size=None):
    """{(sampled slot, goal id)} of one sample, and the batch."""
    batch, info = rb.sample(batch_size, return_info=True)
    goals = batch["desired_goal"][:, 0].tolist()
    return set(zip(info["index"].tolist(), goals)), batch, info


# ---- strategies -----------------------------------------------------------------------------
def test_final_relabels_every_transition_with_its_trajectory_last_goal():
    rb = _buffer(her_ratio=1.0, strategy="final")
    rb.extend(_steps(range(12), done_at=(3, 8)))  # trajectories 0-3, 4-8, 9-11 (unfinished)
    pairs, batch, _ = _pairs(rb)
    final = {**dict.fromkeys(range(4), 3.0), **dict.fromkeys(range(4, 9), 8.0),
             **dict.fromkeys(range(9, 12), 11.0)}
    assert pairs == {(i, final[i]) for i, _ in pairs}
    assert len(pairs) == 12  # every slot drawn at least once with 64 draws
    # the next desired goal moves with it; the achieved goals are untouched
    assert torch.equal(batch["next", "desired_goal"], batch["desired_goal"])
    assert torch.equal(batch["achieved_goal"][:, 0], batch["index"].float())
    # rewards recomputed by reward_fn: 1 where the goal is the step's own achieved goal
    expected = (batch["index"].float() == batch["desired_goal"][:, 0]).float()[:, None]
    assert torch.equal(batch["next", "reward"], expected)
    assert batch["next", "reward"].dtype == torch.float32
    assert batch["desired_goal"].shape == (64, 2)


def test_future_goals_come_from_the_step_or_later_in_its_trajectory():
    rb = _buffer(her_ratio=1.0, strategy=HindsightStrategy.FUTURE, batch_size=256)
    rb.extend(_steps(range(10), done_at=(4, 9)))
    seen = set()
    for _ in range(8):
        pairs, _, _ = _pairs(rb)
        seen |= pairs
    end = lambda i: 4 if i <= 4 else 9  # noqa: E731
    assert all(i <= g <= end(i) for i, g in seen)
    # every allowed (step, goal) pair shows up: the draw is uniform over [t, end]
    assert seen == {(i, float(g)) for i in range(10) for g in range(i, end(i) + 1)}


def test_episode_goals_cover_the_whole_trajectory_and_nothing_else():
    rb = _buffer(her_ratio=1.0, strategy="episode", batch_size=256)
    rb.extend(_steps(range(8), done_at=(2, 7)))
    seen = set()
    for _ in range(8):
        seen |= _pairs(rb)[0]
    episode = lambda i: range(0, 3) if i <= 2 else range(3, 8)  # noqa: E731
    assert seen == {(i, float(g)) for i in range(8) for g in episode(i)}


def test_random_goals_come_from_any_written_step_and_need_no_end_flags():
    rb = _buffer(her_ratio=1.0, strategy="random", batch_size=256)
    data = _steps(range(6))
    del data["next", "done"]
    rb.extend(data)
    goals = set()
    for _ in range(4):
        goals |= {g for _, g in _pairs(rb)[0]}
    assert goals == {float(i) for i in range(6)}


def test_strategy_offsets():
    from_start, to_stop = torch.tensor([0, 3, 2, 0]), torch.tensor([4, 0, 1, 0])
    gen = torch.Generator().manual_seed(0)
    assert HindsightStrategy.FINAL.offsets(from_start, to_stop).tolist() == [4, 0, 1, 0]
    future = torch.stack([HindsightStrategy.FUTURE.offsets(from_start, to_stop, gen)
                          for _ in range(500)])
    assert future.dtype == torch.long
    assert (future >= 0).all() and (future <= to_stop).all()
    assert future.amax(0).tolist() == to_stop.tolist()
    episode = torch.stack([HindsightStrategy.EPISODE.offsets(from_start, to_stop, gen)
                           for _ in range(500)])
    assert episode.amin(0).tolist() == (-from_start).tolist()
    assert episode.amax(0).tolist() == to_stop.tolist()
    with pytest.raises(ValueError, match="RANDOM"):
        HindsightStrategy.RANDOM.offsets(from_start, to_stop)
    assert str(HindsightStrategy.EPISODE) == "episode"
    assert HindsightStrategy("final") is HindsightStrategy.FINAL


# ---- trajectory boundaries of a ring --------------------------------------------------------
def test_a_full_ring_keeps_goals_in_the_trajectory_across_the_wrap_and_cuts_at_the_newest():
    rb = _buffer(capacity=8, her_ratio=1.0, strategy="final")
    rb.extend(_steps(range(6), done_at=(2, 5)))
    rb.extend(_steps(range(6, 11), done_at=(3,)))  # step 9 ends; step 10 is the newest
    # slots hold steps [8, 9, 10, 3, 4, 5, 6, 7]: 6-9 spans the wrap, 10 is cut after
    assert rb.storage[:]["achieved_goal"][:, 0].tolist() == [8, 9, 10, 3, 4, 5, 6, 7]
    pairs, _, _ = _pairs(rb, 128)
    assert pairs == {(0, 9.0), (1, 9.0), (2, 10.0), (3, 5.0), (4, 5.0), (5, 5.0), (6, 9.0),
                     (7, 9.0)}
    rb.strategy = "future"
    seen = set()
    for _ in range(6):
        seen |= _pairs(rb, 128)[0]
    steps = [8, 9, 10, 3, 4, 5, 6, 7]
    for slot, goal in seen:  # never the oldest lap's steps after the newest, never backwards
        step = steps[slot]
        assert step <= goal <= (5 if step <= 5 else 9 if step <= 9 else 10)
    assert (6, 8.0) in seen  # the step written at slot 0, across the wrap


def test_goals_follow_an_edit_of_the_end_flags():
    rb = _buffer(her_ratio=1.0, strategy="final")
    rb.extend(_steps(range(6), done_at=(5,)))
    assert {g for _, g in _pairs(rb)[0]} == {5.0}
    rb[2] = _steps([2], done_at=(0,))[0]  # step 2 now ends a trajectory
    assert _pairs(rb)[0] == {(i, 2.0 if i <= 2 else 5.0) for i in range(6)}


def test_empty_then_refill_forgets_the_old_trajectories():
    rb = _buffer(her_ratio=1.0, strategy="final")
    rb.extend(_steps(range(6), done_at=(5,)))
    rb.sample()
    rb.empty()
    rb.extend(_steps(range(10, 14), done_at=(1,)))
    assert _pairs(rb)[0] == {(0, 11.0), (1, 11.0), (2, 13.0), (3, 13.0)}


# ---- her_ratio ------------------------------------------------------------------------------
@pytest.mark.parametrize("ratio,relabelled", [(0.0, 0), (0.3, 6), (0.8, 16), (1.0, 20)])
def test_her_ratio_relabels_the_first_rows_only(ratio, relabelled):
    rb = _buffer(her_ratio=ratio, strategy="final", batch_size=20)
    data = _steps(range(10), done_at=(9,))
    rb.extend(data)
    batch = rb.sample()
    assert relabelled == int(20 * ratio)
    assert (batch["desired_goal"][:relabelled] == 9.0).all()
    assert (batch["desired_goal"][relabelled:] == -1.0).all()
    assert (batch["next", "reward"][:relabelled] != -99.0).all()
    assert (batch["next", "reward"][relabelled:] == -99.0).all()
    # the stored data never changes
    assert torch.equal(rb.storage[:]["desired_goal"], data["desired_goal"])
    assert torch.equal(rb.storage[:]["next", "reward"], data["next", "reward"])


def test_settings_are_checked_when_set():
    rb = _buffer()
    rb.her_ratio, rb.strategy = 0.5, "episode"
    assert rb.her_ratio == 0.5 and rb.strategy is HindsightStrategy.EPISODE
    with pytest.raises(ValueError, match="her_ratio"):
        rb.her_ratio = 1.01
    with pytest.raises(ValueError, match="strategy"):
        rb.strategy = "past"
    assert rb.her_ratio == 0.5 and rb.strategy is HindsightStrategy.EPISODE


# ---- reward_fn and keys ---------------------------------------------------------------------
def test_reward_fn_output_of_shape_n_is_laid_out_as_the_stored_reward():
    rb = _buffer(reward_fn=lambda td: torch.arange(td.batch_size[0], dtype=torch.float64),
                 her_ratio=0.5, batch_size=8)
    rb.extend(_steps(range(4), done_at=(3,)))
    reward = rb.sample()["next", "reward"]
    assert reward.shape == (8, 1) and reward.dtype == torch.float32
    assert reward[:, 0].tolist() == [0.0, 1.0, 2.0, 3.0, -99.0, -99.0, -99.0, -99.0]


def test_reward_fn_sees_the_relabelled_rows():
    seen = []
    rb = _buffer(reward_fn=lambda td: seen.append(td.clone()) or _reached(td), her_ratio=0.5,
                 strategy="final", batch_size=6)
    rb.extend(_steps(range(3), done_at=(2,)))
    rb.sample()
    assert seen[0].batch_size == (3,) and (seen[0]["desired_goal"] == 2.0).all()


def test_bad_reward_fn_output_is_refused():
    rb = _buffer(reward_fn=lambda td: torch.zeros(td.batch_size[0] + 1), batch_size=4)
    rb.extend(_steps(range(4), done_at=(3,)))
    with pytest.raises(ValueError, match="reward_fn"):
        rb.sample()
    rb.reward_fn = lambda td: [0.0] * td.batch_size[0]
    with pytest.raises(TypeError, match="reward_fn"):
        rb.sample()


def test_custom_and_nested_keys():
    n = 6
    done = torch.zeros(n, 1, dtype=torch.bool)
    done[-1] = True
    data = TensorDict({
        "obs": {"goal": torch.zeros(n, 2), "reached": torch.arange(n * 2.).view(n, 2)},
        "bonus": torch.zeros(n),
        "next": {"obs": {"goal": torch.zeros(n, 2)}, "stop": done},
    }, [n])
    rb = _buffer(reward_fn=lambda td: torch.ones(td.batch_size[0]), her_ratio=1.0,
                 strategy="final", goal_key=("obs", "goal"), achieved_goal_key=("obs", "reached"),
                 reward_key="bonus", end_key=("next", "stop"), batch_size=8)
    rb.extend(data)
    batch = rb.sample()
    assert (batch["obs", "goal"] == torch.tensor([10.0, 11.0])).all()
    assert torch.equal(batch["next", "obs", "goal"], batch["obs", "goal"])
    assert (batch["bonus"] == 1.0).all() and batch["bonus"].shape == (8,)


def test_terminated_and_truncated_end_trajectories_too():
    data = _steps(range(6))
    del data["next", "done"]
    data["next", "terminated"] = torch.tensor([0, 1, 0, 0, 0, 0]).bool()[:, None]
    data["next", "truncated"] = torch.tensor([0, 0, 0, 1, 0, 0]).bool()[:, None]
    rb = _buffer(her_ratio=1.0, strategy="final")
    rb.extend(data)
    assert {(i, g) for i, g in _pairs(rb)[0]} == {(0, 1.0), (1, 1.0), (2, 3.0), (3, 3.0),
                                                  (4, 5.0), (5, 5.0)}


@pytest.mark.parametrize("drop,name", [("desired_goal", "goal_key"),
                                       ("achieved_goal", "achieved_goal_key"),
                                       (("next", "reward"), "reward_key"),
                                       (("next", "done"), "end_key")])
def test_missing_entries_raise_a_key_error_naming_the_argument(drop, name):
    data = _steps(range(4), done_at=(3,))
    del data[drop]
    rb = _buffer()
    rb.extend(data)
    with pytest.raises(KeyError, match=name):
        rb.sample()


def test_a_storage_without_tensordict_rows_is_refused():
    rb = HERReplayBuffer(reward_fn=_reached, storage=ListStorage(10), batch_size=2)
    rb.extend(_steps(range(4), done_at=(3,)))
    with pytest.raises(TypeError, match="storage of TensorDicts .* holds list rows"):
        rb.sample()


@pytest.mark.parametrize("kwargs,error,name", [
    ({"her_ratio": 1.5}, ValueError, "her_ratio"),
    ({"her_ratio": -0.1}, ValueError, "her_ratio"),
    ({"her_ratio": math.nan}, ValueError, "her_ratio"),
    ({"her_ratio": "0.5"}, TypeError, "her_ratio"),
    ({"her_ratio": True}, TypeError, "her_ratio"),
    ({"strategy": "past"}, ValueError, "strategy"),
    ({"goal_key": 3}, TypeError, "goal_key"),
    ({"achieved_goal_key": ("a", 1)}, TypeError, "achieved_goal_key"),
    ({"reward_key": ()}, TypeError, "reward_key"),
    ({"end_key": None}, TypeError, "end_key"),
    ({"reward_fn": "reward"}, TypeError, "reward_fn"),
])
def test_bad_arguments_name_themselves(kwargs, error, name):
    kwargs.setdefault("reward_fn", _reached)
    with pytest.raises(error, match=name):
        HERReplayBuffer(storage=StackedListStorage(10), **kwargs)


def test_repr_names_the_settings():
    text = repr(_buffer(strategy="episode", her_ratio=0.25))
    assert text.startswith("HERReplayBuffer(strategy='episode', her_ratio=0.25, ")
    assert "goal_key='desired_goal'" in text and "StackedListStorage" in text


# ---- state ----------------------------------------------------------------------------------
def test_same_generator_seed_relabels_the_same_way():
    batches = []
    for _ in range(2):
        rb = _buffer(her_ratio=0.5, strategy="future", seed=7)
        rb.extend(_steps(range(20), done_at=(6, 13)))
        batches.append(rb.sample())
    assert torch.equal(batches[0]["desired_goal"], batches[1]["desired_goal"])
    assert torch.equal(batches[0]["index"], batches[1]["index"])


def test_state_dict_round_trip_restores_the_generator_and_keeps_the_settings():
    rb = _buffer(her_ratio=0.5, strategy="episode", seed=3)
    rb.extend(_steps(range(20), done_at=(6, 13)))
    rb.sample()
    rb.her_ratio = 0.75
    state = rb.state_dict()
    assert state["_her"]["her_ratio"] == 0.75 and state["_her"]["strategy"] == "episode"
    assert state["_her"]["episode_ends_cache"].tolist() == [6, 13, 19]
    # the settings the buffer was built with stay, as TorchRL's (and as its batch_size):
    # a run resumed with other settings uses them
    other = _buffer(her_ratio=0.1, strategy="final", seed=99)
    other.load_state_dict(state)
    assert other.her_ratio == 0.1 and other.strategy is HindsightStrategy.FINAL
    restored = _buffer(her_ratio=0.75, strategy="episode", seed=99)
    restored.load_state_dict(state)
    assert "_her" in state  # the caller's dict is left whole
    a, b = rb.sample(), restored.sample()
    assert torch.equal(a["index"], b["index"])
    assert torch.equal(a["desired_goal"], b["desired_goal"])
    assert torch.equal(a["next", "reward"], b["next", "reward"])


def test_a_bad_her_state_changes_nothing():
    rb = _buffer(her_ratio=0.5)
    rb.extend(_steps(range(5), done_at=(4,)))
    state = rb.state_dict()
    state["_her"] = [("strategy", "past")]
    fresh = _buffer(her_ratio=0.2)
    with pytest.raises(ValueError, match=r"state_dict\['_her'\] must be a dict"):
        fresh.load_state_dict(state)
    assert len(fresh) == 0 and fresh.her_ratio == 0.2
    # a plain buffer's state (no "_her") keeps the settings
    plain = TensorDictReplayBuffer(storage=StackedListStorage(100))
    plain.extend(_steps(range(3), done_at=(2,)))
    fresh.load_state_dict(plain.state_dict())
    assert len(fresh) == 3 and fresh.her_ratio == 0.2


def test_dumps_loads_round_trip():
    rb = _buffer(her_ratio=0.6, strategy="future", seed=5)
    rb.extend(_steps(range(15), done_at=(4, 10)))
    rb.sample()
    with tempfile.TemporaryDirectory() as path:
        rb.dumps(path)
        other = _buffer(her_ratio=0.1, strategy="final", seed=0)
        other.loads(path)
        restored = _buffer(her_ratio=0.6, strategy="future", seed=0)
        restored.loads(path)
    assert other.her_ratio == 0.1 and other.strategy is HindsightStrategy.FINAL  # kept
    for _ in range(3):
        a, b = rb.sample(), restored.sample()
        assert torch.equal(a["index"], b["index"])
        assert torch.equal(a["desired_goal"], b["desired_goal"])
        assert torch.equal(a["next", "reward"], b["next", "reward"])


def test_a_reward_fn_of_the_wrong_shape_raises_what_torchrl_programs_catch():
    # a ValueError like tdreplay's other refused data, and a RuntimeError as TorchRL raises
    rb = _buffer(her_ratio=1.0, reward_fn=lambda td: torch.zeros(3))
    rb.extend(_steps(range(6), done_at=(5,)))
    with pytest.raises(RuntimeError, match=r"reward_fn gave values of shape \(3,\)") as caught:
        rb.sample(4)
    assert isinstance(caught.value, ValueError)

