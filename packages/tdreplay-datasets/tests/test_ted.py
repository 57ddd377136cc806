"""The conversion of one Minari episode to TED rows, on hand-made episodes."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from minari import EpisodeData

from tdreplay.datasets import minari_data
from tdreplay.datasets._minari_ted import episode_to_ted


def episode(steps=3, episode_id=7, **overrides) -> EpisodeData:
    fields = dict(
        id=episode_id,
        observations=np.arange((steps + 1) * 2, dtype=np.float32).reshape(steps + 1, 2),
        actions=np.arange(steps),
        rewards=np.linspace(0.5, 1.5, steps),
        terminations=np.array([False] * (steps - 1) + [True]),
        truncations=np.zeros(steps, bool),
        infos={},
    )
    fields.update(overrides)
    return EpisodeData(**fields)


def test_plain_episode():
    dropped = set()
    td = episode_to_ted(episode(), dropped)
    assert td.batch_size == (3,) and not dropped
    assert td["observation"].tolist() == [[0, 1], [2, 3], [4, 5]]
    assert td["next", "observation"].tolist() == [[2, 3], [4, 5], [6, 7]]
    assert td["episode"].tolist() == [7, 7, 7]
    assert td["next", "reward"].tolist() == [[0.5], [1.0], [1.5]]
    assert td["next", "done"].tolist() == [[False], [False], [True]]
    assert "info" not in td.keys()


def test_infos_without_a_reset_value_get_a_zero_first():
    td = episode_to_ted(episode(infos={"cost": np.array([1.0, 2.0, 3.0]),
                                       "seen": np.array([0, 1, 1, 1])}), set())
    assert td["info", "cost"].tolist() == [0.0, 1.0, 2.0]
    assert td["next", "info", "cost"].tolist() == [1.0, 2.0, 3.0]
    assert td["info", "seen"].tolist() == [0, 1, 1]
    assert td["next", "info", "seen"].tolist() == [1, 1, 1]


def test_tuple_observations_and_dict_actions_nest():
    obs = (np.zeros((4, 2), np.float32), np.arange(4))
    actions = {"move": np.ones((3, 2)), "grip": np.array([True, False, True])}
    td = episode_to_ted(episode(observations=obs, actions=actions), set())
    assert td["observation", "1"].tolist() == [0, 1, 2]
    assert td["next", "observation", "1"].tolist() == [1, 2, 3]
    assert td["action", "grip"].dtype == torch.bool and td["action", "move"].shape == (3, 2)


def test_text_is_dropped_and_reported():
    dropped = set()
    obs = {"x": np.zeros((4, 1)), "name": ["a", "b", "c", "d"]}
    infos = {"msg": np.array([b"a", b"b", b"c", b"d"], dtype=object),
             "uni": np.array(["a", "b", "c", "d"])}
    td = episode_to_ted(episode(observations=obs, infos=infos), dropped)
    assert dropped == {"observations.name", "infos.msg", "infos.uni"}
    assert set(td["observation"].keys()) == {"x"}
    assert "info" not in td.keys()


def test_text_only_observations_are_an_error():
    with pytest.raises(ValueError, match="observations hold no numeric data"):
        episode_to_ted(episode(observations=["a", "b", "c", "d"]), set())


def test_wrong_lengths_name_the_entry():
    with pytest.raises(ValueError, match="'observations' has shape \\(3, 2\\), 3 values "
                                         "\\(expected 4 = steps \\+ 1\\)"):
        episode_to_ted(episode(observations=np.zeros((3, 2))), set())
    with pytest.raises(ValueError, match="'infos.state.q'"):
        episode_to_ted(episode(infos={"state": {"q": np.zeros((7, 1))}}), set())


@pytest.mark.parametrize("field, value, match", [
    # (the step count was taken from the rewards: the other entries were blamed)
    ("rewards", np.zeros(4), r"'rewards' has shape \(4,\), 4 values \(expected 3, one per "
     r"step\); the other entries give 3 steps \(observations 4 \(= steps \+ 1\), actions 3, "
     r"terminations 3, truncations 3\)"),
    ("actions", np.arange(4), r"'actions' has shape \(4,\), 4 values \(expected 3, one per "
     r"step\); the other entries give 3 steps \(observations 4 \(= steps \+ 1\), rewards 3"),
    ("observations", {"a": np.zeros((4, 2)), "b": np.zeros(5)},
     r"'observations.b' has shape \(5,\), 5 values \(expected 4 = steps \+ 1\); the other "
     r"entries give 3 steps \(observations.a 4 \(= steps \+ 1\), actions 3"),
    ("terminations", np.array([True]), r"'terminations' has shape \(1,\), 1 value \(expected "
     r"3, one per step\); the other"),
])
def test_the_entry_whose_length_disagrees_with_the_others_is_named(field, value, match):
    with pytest.raises(ValueError, match=f"its entries disagree in length: {match}"):
        episode_to_ted(episode(**{field: value}), set())


def test_lengths_without_a_shared_step_count_are_all_listed():
    odd = episode(observations=np.zeros((2, 2)), actions=np.arange(5), rewards=np.zeros(4),
                  terminations=np.zeros(3, bool), truncations=np.zeros(6, bool))
    with pytest.raises(ValueError, match=r"no step count is shared by most of them: "
                                         r"observations 2 \(= steps \+ 1\), actions 5, "
                                         r"rewards 4, terminations 3, truncations 6"):
        episode_to_ted(odd, set())


def test_a_damaged_episode_is_named_with_the_dataset_and_its_file(tmp_path):
    (tmp_path / "main_data.hdf5").write_bytes(b"")
    bad = episode(episode_id=5, rewards=np.zeros(4))
    with pytest.raises(ValueError, match=(
            f"episode 5 of the Minari dataset 'x/y-v0' \\(group 'episode_5' of the file "
            f"'{tmp_path / 'main_data.hdf5'}'\\) is damaged: its entries disagree in length: "
            "'rewards'")):
        minari_data._convert(fake_dataset([episode(), bad], 6), "x/y-v0", tmp_path / "out",
                             tmp_path)


def fake_dataset(episodes, total_steps):
    return SimpleNamespace(
        total_steps=total_steps, total_episodes=len(episodes),
        iterate_episodes=lambda: iter(episodes),
        spec=SimpleNamespace(minari_version="0.5.4"),
        observation_space=None, action_space=None)


def test_episodes_of_different_layouts_are_refused(tmp_path):
    odd = episode(episode_id=8, observations=np.zeros((4, 3), np.float32))
    with pytest.raises(ValueError, match="episode 8 .* has entries"):
        minari_data._convert(fake_dataset([episode(), odd], 6), "x/y-v0", tmp_path)


@pytest.mark.parametrize("declared", [4, 7])
def test_step_count_must_match_the_metadata(tmp_path, declared):
    with pytest.raises(ValueError, match="steps"):
        minari_data._convert(fake_dataset([episode(), episode()], declared), "x/y-v0", tmp_path)
