"""Trajectory queries: Trajectory, traj predicates, iter/filter_trajectories, rb.query."""

import pytest
import torch
from tensordict import TensorDict, lazy_stack

from tdreplay.core import (
    ListStorage,
    ReplayBuffer,
    RoundRobinWriter,
    TensorDictReplayBuffer,
    Trajectory,
    TrajectoryPredicate,
    Transform,
    filter_trajectories,
    iter_trajectories,
    traj,
)


def _data(lengths=(2, 4, 3), ids=True):
    total = sum(lengths)
    episode = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])
    done = torch.zeros(total, 1, dtype=torch.bool)
    done[torch.tensor(lengths).cumsum(0) - 1] = True
    td = TensorDict({"obs": torch.arange(total, dtype=torch.float32),
                     "next": {"reward": (episode + 1.0).unsqueeze(-1), "done": done}}, [total])
    if ids:
        td["episode"] = episode
    return td


class Scale(Transform):
    def __init__(self, key, factor):
        super().__init__(in_keys=[key], out_keys=[key])
        self.factor, self.calls = factor, 0

    def forward(self, td):
        self.calls += 1
        td[self.in_keys[0]] = td[self.in_keys[0]] * self.factor
        return td


def test_trajectory_view():
    t = Trajectory(_data((4,)))
    assert t.length == len(t) == 4
    assert t.reward.shape == (4, 1) and t.obs.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert float(t.total_reward) == 4.0
    assert isinstance(t[1:3], Trajectory) and t[1:3].length == 2
    assert t["next", "done"].shape == (4, 1)
    with pytest.raises(AttributeError, match="no entry 'pixels'"):
        _ = t.pixels
    with pytest.raises(ValueError, match="single batch dimension"):
        Trajectory(_data((4,)).reshape(2, 2))
    with pytest.raises(TypeError, match="Trajectory expects a TensorDict .* got Tensor"):
        Trajectory(torch.zeros(4))
    stacked = lazy_stack([t, Trajectory(_data((2,)))])
    assert isinstance(stacked, Trajectory) and stacked[1].length == 2


def test_iter_by_ids_flags_and_key():
    assert [t.length for t in iter_trajectories(_data())] == [2, 4, 3]
    with pytest.warns(UserWarning, match="end-of-episode"):
        assert [t.length for t in iter_trajectories(_data(ids=False))] == [2, 4, 3]
    data = _data()
    data["run"] = data.pop("episode")
    assert [t.length for t in iter_trajectories(data, trajectory_key="run")] == [2, 4, 3]
    with pytest.raises(KeyError, match="trajectory_key"):
        list(iter_trajectories(data, trajectory_key="nope"))
    with pytest.raises(KeyError, match="Cannot split"):
        list(iter_trajectories(TensorDict({"obs": torch.zeros(3)}, [3])))
    with pytest.raises(TypeError, match="TensorDictBase"):
        list(iter_trajectories(torch.zeros(3)))


def test_ids_and_flags_must_hold_one_value_a_step():
    data = _data()
    data["episode"] = data["episode"].unsqueeze(-1)  # [T, 1]: one a step
    assert [t.length for t in iter_trajectories(data)] == [2, 4, 3]
    data = _data()
    data["episode"] = torch.stack([data["episode"]] * 2, -1)  # [T, 2]: two ids a step
    with pytest.raises(ValueError, match=r"entry 'episode' has shape \(9, 2\).* one value a step"):
        list(iter_trajectories(data))
    flags = _data(ids=False)
    flags["next", "done"] = torch.zeros(9, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"entry \('next', 'done'\) has shape \(9, 3\)"):
        list(iter_trajectories(flags))


def test_predicates_and_required_keys():
    data = _data()
    assert [t.length for t in filter_trajectories(data, traj.reward.sum() > 5)] == [4, 3]
    assert [t.length for t in filter_trajectories(data, ~(traj.length >= 3))] == [2]
    assert [t.length for t in filter_trajectories(
        data, (traj.reward > 2.5).any() | (traj.obs.first() == 0))] == [2, 3]
    assert [t.length for t in filter_trajectories(data, lambda t: t.length == 4)] == [4]
    with pytest.raises(TypeError, match=r"\.any\(\) or \.all\(\)"):
        filter_trajectories(data, traj.reward > 1)
    p = (traj.reward.mean() > 1) & (traj.length > 1) | (traj["next", "done"].last() == 1)
    assert isinstance(p, TrajectoryPredicate)
    assert p.required_keys() == frozenset({"reward", ("next", "done")})
    assert (traj.total_reward > 0).required_keys() == frozenset({"reward"})


def test_query_oldest_first_after_wrap():
    rb = TensorDictReplayBuffer(storage=ListStorage(8), batch_size=2)
    rb.extend(_data((3, 4)))
    late = _data((3,))
    late["episode"][:] = 2
    rb.extend(late)  # overwrites the first 2 steps of the first trajectory, slot 7 is newest
    assert [t.length for t in rb.query()] == [1, 4, 3]
    assert rb.query(traj.episode.first() == 2)[0].obs.tolist() == [0.0, 1.0, 2.0]


def test_query_transforms_only_what_is_needed():
    obs, reward = Scale("obs", 10.0), Scale(("next", "reward"), 2.0)
    rb = TensorDictReplayBuffer(storage=ListStorage(10), transform=obs)
    rb.append_transform(reward)
    rb.extend(_data())
    kept = rb.query(traj.reward.sum() > 20)  # doubled sums: 4, 16, 18
    assert kept == [] and obs.calls == 0 and reward.calls == 1
    kept = rb.query(traj.reward.sum() > 16)
    assert [t.obs.tolist() for t in kept] == [[60.0, 70.0, 80.0]]
    assert obs.calls == 1
    # the stored data is unchanged
    assert float(rb.storage[6]["obs"]) == 6.0


def test_query_needs_tensordicts_and_empty_is_empty():
    rb = ReplayBuffer(storage=ListStorage(4), writer=RoundRobinWriter())
    assert rb.query() == []
    rb.extend([1, 2])
    with pytest.raises(TypeError, match="tensordict-backed"):
        rb.query()


@pytest.mark.parametrize("combine", [
    lambda: (traj.length >= 2) and (traj.length <= 2),
    lambda: (traj.length >= 2) or (traj.length <= 2),
    lambda: not (traj.length >= 2),
    lambda: 1 < traj.length < 3,
    lambda: bool(traj.length > 100),
    lambda: bool(traj.reward > 0),  # a per-step comparison too
])
def test_python_boolean_operators_on_predicates_raise(combine) -> None:
    # and / or / not and chained comparisons would keep one side and drop the other silently
    with pytest.raises(TypeError, match=r"has no truth value: combine predicates with &, \|"):
        combine()


def test_a_range_written_with_ampersand_filters_both_sides() -> None:
    steps = TensorDict({"episode": torch.tensor([0, 0, 1, 2, 2, 2]),
                        ("next", "reward"): torch.ones(6, 1)}, [6])
    kept = filter_trajectories(steps, (traj.length > 1) & (traj.length < 3))
    assert [t.length for t in kept] == [2]


def test_two_expressions_compare_trajectory_by_trajectory():
    # (traj.reward.sum() > traj.length raised a TypeError about chained comparisons;
    # TorchRL returns every trajectory)
    data = _data((2, 4, 3))  # rewards 1, 2, 3 a step
    lengths = [t.length for t in filter_trajectories(data, traj.reward.sum() > traj.length,
                                                     trajectory_key="episode")]
    assert lengths == [4, 3]  # 2 > 2, 8 > 4, 9 > 3
    lengths = [t.length for t in filter_trajectories(data, traj.reward.mean() >= traj.length,
                                                     trajectory_key="episode")]
    assert lengths == [3]  # 1 >= 2, 2 >= 4, 3 >= 3
    predicate = traj.reward.sum() >= traj.length
    assert isinstance(predicate, TrajectoryPredicate)
    assert sorted(predicate.required_keys()) == ["reward"]
    assert repr(predicate) == "TrajectoryPredicate((traj.reward.sum() >= traj.length))"
    # per step against a per-trajectory value: a stepwise comparison, reduced with any / all
    above_first = (traj.obs > traj.obs.first()).any()
    assert [t.length for t in filter_trajectories(data, above_first,
                                                  trajectory_key="episode")] == [2, 4, 3]
    assert [t.length for t in filter_trajectories(data, (traj.obs > traj.obs.last()).any(),
                                                  trajectory_key="episode")] == []
    with pytest.raises(TypeError, match="no truth value"):
        bool(traj.obs > traj.obs.first())


@pytest.mark.parametrize("key", [5, ["episode"], ("next", 3), ()])
def test_a_trajectory_key_that_is_no_key_is_a_type_error_naming_it(key):
    # (a KeyError "Only NestedKeys are supported" that did not name trajectory_key)
    rb = TensorDictReplayBuffer(storage=ListStorage(10))
    rb.extend(_data())
    with pytest.raises(TypeError, match="trajectory_key must be a str or a tuple of str"):
        rb.query(trajectory_key=key)
    with pytest.raises(TypeError, match="trajectory_key must be"):
        list(iter_trajectories(_data(), trajectory_key=key))
