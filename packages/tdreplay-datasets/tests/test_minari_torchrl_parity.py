"""MinariExperienceReplay where a differential test against TorchRL 0.14.1 found differences.

Each test builds small Minari datasets locally (nothing is downloaded). Expected values are
the ones TorchRL 0.14.1 gives on the same datasets (its ``memmap_like`` bug, which stores only
zeros, worked around), except where tdreplay keeps a documented difference (split_trajs splits
on episode ids).
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

import gymnasium as gym
import minari
import numpy as np
import pytest
import torch
from gymnasium import spaces
from minari.data_collector import EpisodeBuffer

from tdreplay.datasets import MinariExperienceReplay, minari_data


def make(minari_dir: Path, dataset_id: str, lengths=(3, 2), ends=("term", "term"),
         reward_scale: float = 1.0, infos=None) -> None:
    """A local Minari dataset; episode ``i`` has observations ``10 * i + t`` and rewards
    ``reward_scale * (t + 1)``; ``ends`` says how each episode ends ("term", "trunc" or
    "none": neither flag). An existing dataset of that id is replaced."""
    shutil.rmtree(minari_dir / dataset_id, ignore_errors=True)
    episodes = []
    for i, (steps, end) in enumerate(zip(lengths, ends)):
        terminated, truncated = np.zeros(steps, bool), np.zeros(steps, bool)
        if end == "term":
            terminated[-1] = True
        if end == "trunc":
            truncated[-1] = True
        episodes.append(EpisodeBuffer(
            id=i, observations=np.arange(steps + 1, dtype=np.float32)[:, None] + 10 * i,
            actions=np.zeros(steps, np.int64),
            rewards=reward_scale * np.arange(1, steps + 1, dtype=np.float64),
            terminations=terminated, truncations=truncated,
            infos=infos(steps) if infos else {}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        minari.create_dataset_from_buffers(
            dataset_id, episodes, observation_space=spaces.Box(-100, 100, (1,), np.float32),
            action_space=spaces.Discrete(2), algorithm_name="x")


def load(dataset_id: str, root: Path, batch_size=4, **kwargs) -> MinariExperienceReplay:
    kwargs.setdefault("load_from_local_minari", True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return MinariExperienceReplay(dataset_id, batch_size, root=root, **kwargs)


def rewards(data: MinariExperienceReplay) -> list[float]:
    return data[:]["next", "reward"].flatten().tolist()


# ---- 1. a changed local source is converted again (repro_01) ---------------------------------
def test_changed_local_source_is_converted_again(minari_dir, root, count_conversions):
    make(minari_dir, "local/data-v0")
    assert rewards(load("local/data-v0", root)) == [1.0, 2.0, 3.0, 1.0, 2.0]
    split = load("local/data-v0", root, split_trajs=True)
    assert split[:]["next", "reward"][..., 0].tolist() == [[1.0, 2.0, 3.0], [1.0, 2.0, 0.0]]
    # unchanged source: reused
    assert rewards(load("local/data-v0", root)) == [1.0, 2.0, 3.0, 1.0, 2.0]
    assert count_conversions == ["local/data-v0"]

    make(minari_dir, "local/data-v0", reward_scale=100.0)  # re-recorded under the same id
    assert rewards(load("local/data-v0", root)) == [100.0, 200.0, 300.0, 100.0, 200.0]
    assert count_conversions == ["local/data-v0"] * 2
    # the split made from the old conversion is made again from the new one
    again = load("local/data-v0", root, split_trajs=True)
    assert again[:]["next", "reward"][..., 0].tolist() == [[100.0, 200.0, 300.0],
                                                            [100.0, 200.0, 0.0]]
    assert count_conversions == ["local/data-v0"] * 2
    # without load_from_local_minari the conversion is used as it is
    assert rewards(load("local/data-v0", root, download=False, load_from_local_minari=False)) \
        == [100.0, 200.0, 300.0, 100.0, 200.0]
    assert sorted(os.listdir(root / "local")) == ["data-v0", "data-v0_split"]


def test_changed_split_source_is_seen_first_with_split_trajs(minari_dir, root, count_conversions):
    make(minari_dir, "local/split-v0")
    load("local/split-v0", root, split_trajs=True)
    make(minari_dir, "local/split-v0", lengths=(1, 1, 2), ends=("term", "trunc", "term"),
         reward_scale=5.0)
    data = load("local/split-v0", root, split_trajs=True)
    assert count_conversions == ["local/split-v0"] * 2
    assert data[:]["next", "reward"][..., 0].tolist() == [[5.0, 0.0], [5.0, 0.0], [5.0, 10.0]]
    assert data[:]["traj_ids"].tolist() == [[0, 0], [1, 0], [2, 2]]


def test_same_size_and_mtime_but_new_content_is_converted_again(minari_dir, root, count_conversions):
    make(minari_dir, "local/same-v0", reward_scale=1.0)
    load("local/same-v0", root)
    files = {p: p.stat() for p in (minari_dir / "local/same-v0/data").iterdir()}
    make(minari_dir, "local/same-v0", reward_scale=7.0)
    for path, stat in files.items():  # same names, sizes and times: only the content differs
        assert path.stat().st_size == stat.st_size
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert rewards(load("local/same-v0", root)) == [7.0, 14.0, 21.0, 7.0, 14.0]
    assert count_conversions == ["local/same-v0"] * 2


def test_failed_reconversion_keeps_the_old_conversion(minari_dir, root, monkeypatch):
    make(minari_dir, "local/fail-v0")
    load("local/fail-v0", root)
    make(minari_dir, "local/fail-v0", reward_scale=3.0)

    convert = minari_data._convert

    def broken(*args):
        raise RuntimeError("disk full")

    monkeypatch.setattr(minari_data, "_convert", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        load("local/fail-v0", root)
    assert sorted(os.listdir(root / "local")) == ["fail-v0"]  # no scratch left behind
    assert rewards(load("local/fail-v0", root, download=False, load_from_local_minari=False)) \
        == [1.0, 2.0, 3.0, 1.0, 2.0]
    monkeypatch.setattr(minari_data, "_convert", convert)
    assert rewards(load("local/fail-v0", root)) == [3.0, 6.0, 9.0, 3.0, 6.0]


def test_a_fresh_conversion_published_meanwhile_is_kept(minari_dir, root, monkeypatch):
    make(minari_dir, "local/race-v0")
    load("local/race-v0", root)
    make(minari_dir, "local/race-v0", reward_scale=2.0)
    marker = root / "local/race-v0" / "tdreplay-dataset.json"
    convert = minari_data._convert
    published: list[str] = []

    def racing(dataset, dataset_id, dest, *args):
        convert(dataset, dataset_id, dest, *args)
        if not published:  # another construction converts the new source and publishes first
            published.append("")
            load("local/race-v0", root)
            published[0] = json.loads(marker.read_text())["conversion"]

    monkeypatch.setattr(minari_data, "_convert", racing)
    data = load("local/race-v0", root)
    assert json.loads(marker.read_text())["conversion"] == published[0]  # theirs was kept
    assert rewards(data) == [2.0, 4.0, 6.0, 2.0, 4.0]
    assert sorted(os.listdir(root / "local")) == ["race-v0"]


def test_local_source_gone_is_an_error_even_when_converted(minari_dir, root):
    make(minari_dir, "local/gone-v0")
    load("local/gone-v0", root)
    shutil.rmtree(minari_dir / "local/gone-v0")
    with pytest.raises(FileNotFoundError, match="not in the local Minari cache"):
        load("local/gone-v0", root)
    assert len(load("local/gone-v0", root, download=False, load_from_local_minari=False)) == 5


def test_conversion_of_an_older_format_is_converted_again(minari_dir, root, count_conversions):
    make(minari_dir, "old/fmt-v0")
    data = load("old/fmt-v0", root)
    marker = data.data_path_root / "tdreplay-dataset.json"
    meta = json.loads(marker.read_text())
    marker.write_text(json.dumps({**meta, "format": 1}))
    with pytest.raises(FileNotFoundError, match="older version of tdreplay-datasets"):
        load("old/fmt-v0", root, download=False, load_from_local_minari=False)
    assert len(load("old/fmt-v0", root)) == 5
    assert count_conversions == ["old/fmt-v0"] * 2
    assert json.loads(marker.read_text())["format"] == minari_data._FORMAT


# ---- 2. split_trajs splits on the episode ids (repro_04; a documented difference) -----------
def test_split_keeps_an_episode_ending_with_neither_flag_on_its_own_row(minari_dir, root):
    make(minari_dir, "split/nodone-v0", lengths=(3, 2, 2), ends=("term", "none", "trunc"))
    data = load("split/nodone-v0", root, batch_size=2, split_trajs=True)
    rows = data[:]
    assert len(data) == 3 and rows.batch_size == (3, 3)
    assert rows["episode"].tolist() == [[0, 0, 0], [1, 1, 0], [2, 2, 0]]
    assert rows["mask"].tolist() == [[True, True, True], [True, True, False],
                                     [True, True, False]]
    assert rows["traj_ids"].tolist() == [[0, 0, 0], [1, 1, 0], [2, 2, 0]]
    assert rows["next", "done"][..., 0].tolist() == [[False, False, True], [False, False, False],
                                                     [False, True, False]]


# ---- 3. an info named "state" stays in the info (repro_02) ----------------------------------
def test_info_named_state_stays_under_info(minari_dir, root):
    def infos(steps):
        return {"state": np.arange(steps + 1, dtype=np.float64)[:, None] * [1.0, 2.0],
                "success": np.arange(steps + 1) % 2 == 1}

    make(minari_dir, "info/state-v0", infos=infos)
    rows = load("info/state-v0", root)[:]
    assert sorted(str(k) for k in rows.keys(True, True) if "state" in str(k) or "info" in str(k)
                  ) == ["('info', 'state')", "('info', 'success')", "('next', 'info', 'state')",
                        "('next', 'info', 'success')"]
    assert "state" not in rows.keys() and "state" not in rows["next"].keys()
    assert rows["info", "state"].shape == (5, 2) and rows["info", "state"].dtype == torch.float64
    assert rows["info", "state"][:, 1].tolist() == [0.0, 2.0, 4.0, 0.0, 2.0]
    assert rows["next", "info", "state"][:, 0].tolist() == [1.0, 2.0, 3.0, 1.0, 2.0]
    assert rows["next", "info", "success"].tolist() == [True, False, True, True, False]


# ---- 4. split data carries traj_ids (repro_03) ----------------------------------------------
def test_split_data_and_samples_carry_traj_ids(minari_dir, root):
    make(minari_dir, "split/ids-v0", lengths=(3, 2, 1), ends=("term", "trunc", "term"))
    data = load("split/ids-v0", root, batch_size=2, split_trajs=True)
    rows = data[:]
    assert sorted(str(k) for k in rows.keys(True, True)) == [
        "('next', 'done')", "('next', 'observation')", "('next', 'reward')",
        "('next', 'terminated')", "('next', 'truncated')", "action", "episode", "mask",
        "observation", "traj_ids"]
    assert rows["traj_ids"].dtype == torch.int64
    assert rows["traj_ids"].tolist() == [[0, 0, 0], [1, 1, 0], [2, 0, 0]]
    data.set_rng(torch.Generator().manual_seed(0))
    sample = data.sample()
    assert sample["traj_ids"].shape == (2, 3)
    for row, index in zip(sample["traj_ids"], sample["index"][:, 0]):
        assert row.tolist() == rows["traj_ids"][index].tolist()
    assert "traj_ids" not in load("split/ids-v0", root, download=False)[:].keys()


# ---- 5. and 6. metadata and metadata_path (repro_05, repro_06) --------------------------------
def test_metadata_has_torchrls_spec_entries(minari_dir, root):
    make(minari_dir, "meta/data-v0")
    data = load("meta/data-v0", root)
    m = data.metadata
    assert sorted(m) == ["action_space", "combined_datasets", "data_path", "dataset_id",
                         "dataset_name", "dropped_text", "env_spec", "minari_version",
                         "namespace", "observation_space", "split_trajs", "total_episodes",
                         "total_steps", "version"]
    assert m["namespace"] == "meta" and m["dataset_name"] == "data" and m["version"] == 0
    assert type(m["version"]) is int and m["env_spec"] is None
    assert m["combined_datasets"] == [] and m["dataset_id"] == "meta/data-v0"
    assert m["data_path"] == str(minari_dir / "meta/data-v0/data")
    assert (m["total_steps"], m["total_episodes"]) == (5, 2)
    # spaces stay gymnasium spaces
    assert m["observation_space"] == spaces.Box(-100, 100, (1,), np.float32)
    assert m["action_space"] == spaces.Discrete(2)
    split = load("meta/data-v0", root, split_trajs=True)
    assert {k: v for k, v in split.metadata.items() if k not in ("split_trajs", "max_len")} \
        == {k: v for k, v in m.items() if k != "split_trajs"}


def test_metadata_of_a_recorded_env_and_a_name_without_namespace(minari_dir, root):
    env = gym.make("CartPole-v1", max_episode_steps=5)
    obs, _ = env.reset(seed=0)
    observations, terminations, truncations = [obs], [], []
    while not (terminations and (terminations[-1] or truncations[-1])):
        obs, _, terminated, truncated, _ = env.step(0)
        observations.append(obs)
        terminations.append(terminated)
        truncations.append(truncated)
    steps = len(terminations)
    episode = EpisodeBuffer(id=0, observations=np.stack(observations),
                            actions=np.zeros(steps, np.int64), rewards=np.ones(steps),
                            terminations=np.array(terminations),
                            truncations=np.array(truncations), infos={})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        minari.create_dataset_from_buffers("cartpole-v2", [episode], env=env,
                                           algorithm_name="x")
    m = load("cartpole-v2", root).metadata
    assert m["namespace"] is None and m["dataset_name"] == "cartpole" and m["version"] == 2
    spec = m["env_spec"]
    assert isinstance(spec, dict)
    assert spec["id"] == "CartPole-v1" and spec["max_episode_steps"] == 5
    assert spec["entry_point"] == "gymnasium.envs.classic_control.cartpole:CartPoleEnv"
    assert spec["additional_wrappers"] == [] and spec["kwargs"] == {}


def test_metadata_path_holds_the_spec_as_torchrl_writes_it(minari_dir, root):
    make(minari_dir, "meta/path-v0")
    data = load("meta/path-v0", root)
    assert data.metadata_path == root / "meta/path-v0" / "env_metadata.json"
    written = json.loads(data.metadata_path.read_text())
    # what TorchRL 0.14.1 writes for this dataset (data_path aside)
    assert written == {
        "env_spec": None, "total_episodes": 2, "total_steps": 5, "dataset_id": "meta/path-v0",
        "combined_datasets": [],
        "observation_space": {"type": "Box", "low": [-100.0], "high": [100.0],
                              "dtype": "float32", "shape": [1]},
        "action_space": {"type": "Discrete", "dtype": "int64", "n": 2, "shape": []},
        "data_path": str(minari_dir / "meta/path-v0/data"), "minari_version": minari.__version__,
        "namespace": "meta", "dataset_name": "path", "version": 0}
    split = load("meta/path-v0", root, split_trajs=True)
    assert split.metadata_path == data.metadata_path  # the flat conversion's, as in TorchRL


def test_metadata_path_writes_dict_spaces_and_null_for_others(minari_dir, root):
    obs_space = spaces.Dict({"pos": spaces.Box(-1, 1, (2,), np.float32),
                             "pair": spaces.Tuple((spaces.Discrete(3), spaces.Discrete(2)))})
    episode = EpisodeBuffer(
        id=0, observations={"pos": np.zeros((3, 2), np.float32),
                            "pair": (np.zeros(3, np.int64), np.zeros(3, np.int64))},
        actions=np.zeros(2, np.int64), rewards=np.ones(2),
        terminations=np.array([False, True]), truncations=np.zeros(2, bool), infos={})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        minari.create_dataset_from_buffers("meta/dict-v0", [episode], observation_space=obs_space,
                                           action_space=spaces.Discrete(2), algorithm_name="x")
    data = load("meta/dict-v0", root)
    written = json.loads(data.metadata_path.read_text())
    assert written["observation_space"] == {"type": "Dict", "subspaces": {
        "pos": {"type": "Box", "low": [-1.0, -1.0], "high": [1.0, 1.0], "dtype": "float32",
                "shape": [2]},
        "pair": None}}
    assert data.metadata["observation_space"] == obs_space


# ---- 7. construction arguments (repro_07) ---------------------------------------------------
def test_batch_size_none_is_accepted(minari_dir, root):
    make(minari_dir, "args/data-v0")
    data = MinariExperienceReplay("args/data-v0", root=root, load_from_local_minari=True)
    assert data.sample(3).batch_size == (3,)
    with pytest.raises(RuntimeError, match="batch_size not specified"):
        data.sample()
    none = MinariExperienceReplay("args/data-v0", None, root=root, download=False)
    assert none.sample(2).batch_size == (2,)


@pytest.mark.parametrize("download", ["yes", "", None, 1, 0, "Force", "true"])
def test_download_other_than_bool_or_force_names_download(minari_dir, root, download):
    make(minari_dir, "args/bad-v0")
    with pytest.raises(ValueError, match=r"download must be True, False or 'force'"):
        MinariExperienceReplay("args/bad-v0", 4, root=root, download=download,
                               load_from_local_minari=True)
    assert not root.exists()


def test_numpy_bools_are_bools_for_download(minari_dir, root):
    make(minari_dir, "args/np-v0")
    load("args/np-v0", root)
    data = MinariExperienceReplay("args/np-v0", 4, root=root, download=np.bool_(False))
    assert data.download is False and len(data) == 5


# ---- 8. delete() removes what the buffer reads (repro_08) -------------------------------------
def test_delete_of_a_split_buffer_keeps_the_flat_conversion(minari_dir, root, count_conversions):
    make(minari_dir, "del/data-v0")
    load("del/data-v0", root)
    split = load("del/data-v0", root, batch_size=2, download=False, split_trajs=True,
                 load_from_local_minari=False)
    split.delete()
    assert sorted(os.listdir(root / "del")) == ["data-v0"]
    flat = load("del/data-v0", root, download=False, load_from_local_minari=False)
    assert rewards(flat) == [1.0, 2.0, 3.0, 1.0, 2.0]
    again = load("del/data-v0", root, download=False, split_trajs=True,
                 load_from_local_minari=False)
    assert again[:].batch_size == (2, 3)
    assert count_conversions == ["del/data-v0"]  # split again from the flat data, not converted


def test_delete_of_a_flat_buffer_keeps_its_split(minari_dir, root, count_conversions):
    make(minari_dir, "del/flat-v0")
    load("del/flat-v0", root, split_trajs=True)
    flat = load("del/flat-v0", root)
    flat.delete()
    assert sorted(os.listdir(root / "del")) == ["flat-v0_split"]
    split = load("del/flat-v0", root, download=False, split_trajs=True,
                 load_from_local_minari=False)
    assert split[:]["next", "reward"][..., 0].tolist() == [[1.0, 2.0, 3.0], [1.0, 2.0, 0.0]]
    with pytest.raises(FileNotFoundError, match="not converted under root"):
        load("del/flat-v0", root, download=False, load_from_local_minari=False)
    # converting the flat data again makes the split again from it
    load("del/flat-v0", root)
    load("del/flat-v0", root, split_trajs=True)
    assert count_conversions == ["del/flat-v0"] * 2
    split.delete()
    load("del/flat-v0", root).delete()
    assert not root.joinpath("del").exists()
