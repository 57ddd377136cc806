"""MinariExperienceReplay on small Minari datasets built locally (nothing is downloaded)."""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import minari
import numpy as np
import pytest
import torch

from tdreplay.core import RandomSampler
from tdreplay.datasets import MinariExperienceReplay, minari_data
from tdreplay.writers import ImmutableDatasetWriter

CARTPOLE_ID = "cartpole/tiny-v0"  # the id the conftest's cartpole fixture builds


def source_episodes(dataset_id: str) -> list:
    """The episodes of the local Minari dataset, read with Minari's own API."""
    return list(minari.load_dataset(dataset_id).iterate_episodes())


def expected_rows(dataset_id: str) -> dict[str, np.ndarray]:
    """The TED entries of every step of the source, in episode order, built from the raw arrays."""
    rows: dict[str, list] = {key: [] for key in
                             ("obs", "next_obs", "action", "reward", "terminated", "truncated",
                              "episode", "step")}
    for ep in source_episodes(dataset_id):
        steps = len(ep.rewards)
        rows["obs"].append(ep.observations[:-1])
        rows["next_obs"].append(ep.observations[1:])
        rows["action"].append(ep.actions)
        rows["reward"].append(ep.rewards)
        rows["terminated"].append(ep.terminations)
        rows["truncated"].append(ep.truncations)
        rows["episode"].append(np.full(steps, ep.id))
        rows["step"].append(np.arange(steps))
    return {key: np.concatenate(value) for key, value in rows.items()}


def load(dataset_id: str, root: Path, **kwargs) -> MinariExperienceReplay:
    kwargs.setdefault("load_from_local_minari", True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # text dropped from the dict dataset
        return MinariExperienceReplay(dataset_id, kwargs.pop("batch_size", 8), root=root, **kwargs)


@pytest.fixture
def fake_download(monkeypatch, tmp_path):
    """``minari.download_dataset`` replaced by a copy from a "remote" directory of locally made
    datasets into Minari's cache (wherever ``MINARI_DATASETS_PATH`` points at call time)."""
    remote = tmp_path / "remote"
    calls: list[dict] = []

    def download_dataset(dataset_id, force_download=False):
        target = minari.storage.datasets_root_dir.get_dataset_path(dataset_id)
        calls.append({"dataset_id": dataset_id, "target": target,
                      "force_download": force_download})
        source = remote / dataset_id
        if not source.exists():
            raise ValueError(f"The dataset version, {dataset_id}, doesn't exist in the remote "
                             "Farama server.")
        shutil.copytree(source, target)

    monkeypatch.setattr(minari, "download_dataset", download_dataset)
    return remote, calls


def make_remote(remote: Path, monkeypatch, maker) -> None:
    """Create a dataset in the "remote" directory, then point the local Minari cache at an empty
    directory again."""
    local = os.environ["MINARI_DATASETS_PATH"]
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(remote))
    maker()
    monkeypatch.setenv("MINARI_DATASETS_PATH", local)


def tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []


# ---- layout and values -----------------------------------------------------------------------
def test_cartpole_rows_are_the_source_steps_in_ted_layout(cartpole, root):
    data = load(cartpole, root)
    expected = expected_rows(cartpole)
    rows = data[:]
    n = len(expected["reward"])
    assert len(data) == n == data.metadata["total_steps"]
    assert rows.batch_size == (n,)
    assert rows["observation"].dtype == torch.float32 and rows["observation"].shape == (n, 4)
    assert rows["action"].dtype == torch.int64 and rows["action"].shape == (n,)
    assert rows["episode"].dtype == torch.int64 and rows["episode"].shape == (n,)
    for key in ("reward", "terminated", "truncated", "done"):
        assert rows["next", key].shape == (n, 1), key
    assert rows["next", "reward"].dtype == torch.float64
    for key in ("terminated", "truncated", "done"):
        assert rows["next", key].dtype == torch.bool
    np.testing.assert_array_equal(rows["observation"].numpy(), expected["obs"])
    np.testing.assert_array_equal(rows["next", "observation"].numpy(), expected["next_obs"])
    np.testing.assert_array_equal(rows["action"].numpy(), expected["action"])
    np.testing.assert_array_equal(rows["next", "reward"].numpy()[:, 0], expected["reward"])
    np.testing.assert_array_equal(rows["next", "terminated"].numpy()[:, 0], expected["terminated"])
    np.testing.assert_array_equal(rows["next", "truncated"].numpy()[:, 0], expected["truncated"])
    np.testing.assert_array_equal(rows["next", "done"].numpy()[:, 0],
                                  expected["terminated"] | expected["truncated"])
    np.testing.assert_array_equal(rows["episode"].numpy(), expected["episode"])
    # the source really has both kinds of endings, each only at an episode's last step
    last = np.r_[expected["episode"][1:] != expected["episode"][:-1], True]
    assert (expected["terminated"] & ~expected["truncated"]).any()
    assert (expected["truncated"] & ~expected["terminated"]).any()
    np.testing.assert_array_equal(rows["next", "done"].numpy()[:, 0], last)
    assert set(rows.keys(include_nested=True, leaves_only=True)) == {
        "observation", "action", "episode", ("next", "observation"), ("next", "reward"),
        ("next", "terminated"), ("next", "truncated"), ("next", "done")}


def test_samples_match_the_source_episodes(cartpole, root):
    data = load(cartpole, root, batch_size=16)
    data.set_rng(torch.Generator().manual_seed(0))
    episodes = {ep.id: ep for ep in source_episodes(cartpole)}
    expected = expected_rows(cartpole)
    seen = set()
    for _ in range(5):
        sample = data.sample()
        assert sample.batch_size == (16,)
        for i in range(16):
            index = int(sample["index"][i])
            seen.add(index)
            ep = episodes[int(sample["episode"][i])]
            t = int(expected["step"][index])
            np.testing.assert_array_equal(sample["observation"][i].numpy(), ep.observations[t])
            np.testing.assert_array_equal(sample["next", "observation"][i].numpy(),
                                          ep.observations[t + 1])
            assert int(sample["action"][i]) == ep.actions[t]
            assert float(sample["next", "reward"][i]) == ep.rewards[t]
            assert bool(sample["next", "terminated"][i]) == ep.terminations[t]
            assert bool(sample["next", "truncated"][i]) == ep.truncations[t]
            assert bool(sample["next", "done"][i]) == (ep.terminations[t] or ep.truncations[t])
    assert len(seen) > 16  # the sampler drew from all over the dataset
    assert data.sample(batch_size=3).batch_size == (3,)


def test_dict_observations_and_infos_become_nested(dict_dataset, root):
    with pytest.warns(UserWarning, match=r"text data .*\['infos.phase', 'observations.label'\]"):
        data = MinariExperienceReplay(dict_dataset, 4, root=root, load_from_local_minari=True)
    rows = data[:]
    assert set(rows.keys(include_nested=True, leaves_only=True)) == {
        ("observation", "position"), ("observation", "goal"), "action", "episode",
        ("info", "distance"), ("info", "success"), ("info", "state", "qpos"),
        ("next", "observation", "position"), ("next", "observation", "goal"),
        ("next", "info", "distance"), ("next", "info", "success"),
        ("next", "info", "state", "qpos"),
        ("next", "reward"), ("next", "terminated"), ("next", "truncated"), ("next", "done")}
    assert data.metadata["dropped_text"] == ["infos.phase", "observations.label"]
    start = 0
    for ep in source_episodes(dict_dataset):
        steps = len(ep.rewards)
        part = rows[start:start + steps]
        start += steps
        assert (part["episode"] == ep.id).all()
        obs = ep.observations
        np.testing.assert_array_equal(part["observation", "position"].numpy(), obs["position"][:-1])
        np.testing.assert_array_equal(part["next", "observation", "position"].numpy(),
                                      obs["position"][1:])
        np.testing.assert_array_equal(part["observation", "goal"].numpy(), obs["goal"][:-1])
        np.testing.assert_array_equal(part["action"].numpy(), ep.actions)
        # info before the step (the reset info first), next info after it
        np.testing.assert_array_equal(part["info", "distance"].numpy(), ep.infos["distance"][:-1])
        np.testing.assert_array_equal(part["next", "info", "distance"].numpy(),
                                      ep.infos["distance"][1:])
        np.testing.assert_array_equal(part["next", "info", "success"].numpy(),
                                      ep.infos["success"][1:])
        # an info named "state" stays in the info, as in TorchRL
        np.testing.assert_array_equal(part["info", "state", "qpos"].numpy(),
                                      ep.infos["state"]["qpos"][:-1])
        np.testing.assert_array_equal(part["next", "info", "state", "qpos"].numpy(),
                                      ep.infos["state"]["qpos"][1:])
        np.testing.assert_array_equal(part["next", "terminated"].numpy()[:, 0], ep.terminations)
        np.testing.assert_array_equal(part["next", "truncated"].numpy()[:, 0], ep.truncations)
    assert start == len(data)
    sample = data.sample()
    assert sample["observation", "position"].shape == (4, 2)
    assert sample["next", "info", "state", "qpos"].shape == (4, 3)


def test_metadata_keeps_the_spaces(dict_dataset, root):
    data = load(dict_dataset, root)
    source = minari.load_dataset(dict_dataset)
    assert data.metadata["observation_space"] == source.observation_space
    assert data.metadata["action_space"] == source.action_space
    assert data.metadata["total_episodes"] == source.total_episodes == 4
    assert data.metadata["minari_version"] == source.spec.minari_version


# ---- split trajectories ----------------------------------------------------------------------
def test_split_trajs_pads_each_episode_with_a_mask(cartpole, root):
    data = load(cartpole, root, split_trajs=True, batch_size=3)
    episodes = source_episodes(cartpole)
    max_len = max(len(ep.rewards) for ep in episodes)
    assert data.data_path == root / (cartpole + "_split")
    assert data.data_path_root == root / cartpole
    assert data.metadata["max_len"] == max_len
    rows = data[:]
    assert rows.batch_size == (len(episodes), max_len)
    assert len(data) == len(episodes)
    for row, ep in zip(rows.unbind(0), episodes):
        steps = len(ep.rewards)
        assert row["mask"].tolist() == [True] * steps + [False] * (max_len - steps)
        real, pad = row[:steps], row[steps:]
        assert (real["episode"] == ep.id).all()
        np.testing.assert_array_equal(real["observation"].numpy(), ep.observations[:-1])
        np.testing.assert_array_equal(real["next", "observation"].numpy(), ep.observations[1:])
        np.testing.assert_array_equal(real["action"].numpy(), ep.actions)
        np.testing.assert_array_equal(real["next", "terminated"].numpy()[:, 0], ep.terminations)
        np.testing.assert_array_equal(real["next", "truncated"].numpy()[:, 0], ep.truncations)
        assert real["next", "done"][:, 0].tolist() == [False] * (steps - 1) + [True]
        for key, value in pad.items(include_nested=True, leaves_only=True):
            assert not value.any(), key
    sample = data.sample()
    assert sample.batch_size == (3, max_len)
    assert sample["index"].shape == (3, max_len)
    for i in range(3):
        index = int(sample["index"][i, 0])
        assert (sample[i].exclude("index") == rows[index]).all()
        assert (sample["index"][i] == index).all()


def test_split_reuses_the_flat_conversion(cartpole, root, count_conversions):
    flat = load(cartpole, root)
    split = load(cartpole, root, split_trajs=True, download=False)
    assert count_conversions == [cartpole]
    assert (split[:]["mask"].sum() == len(flat))
    again = load(cartpole, root, split_trajs=True, download=False)
    assert count_conversions == [cartpole]
    assert (again[:] == split[:]).all()


# ---- reuse, force, delete --------------------------------------------------------------------
def test_second_construction_reuses_the_memmap_files(cartpole, root, count_conversions):
    first = load(cartpole, root)
    files = {p: p.stat().st_mtime_ns for p in (root / cartpole).rglob("*.memmap")}
    assert files and all(Path(p).is_relative_to(root / cartpole) for p in files)
    second = MinariExperienceReplay(cartpole, 4, root=root)  # download=True: nothing to fetch
    assert count_conversions == [cartpole]
    assert {p: p.stat().st_mtime_ns for p in (root / cartpole).rglob("*.memmap")} == files
    assert (second[:] == first[:]).all()


def test_force_converts_again_from_the_new_source(cartpole, root, count_conversions,
                                                  cartpole_maker):
    old = load(cartpole, root)[:]
    load(cartpole, root, split_trajs=True)
    minari.delete_dataset(cartpole)
    cartpole_maker(seeds=(10, 11, 12))
    stale = load(cartpole, root, download=False, load_from_local_minari=False)
    assert (stale[:] == old).all()  # the local source is not read: the copy is reused
    assert count_conversions == [cartpole]
    fresh = load(cartpole, root, download="force")
    assert count_conversions == [cartpole, cartpole]
    np.testing.assert_array_equal(fresh[:]["observation"].numpy(), expected_rows(cartpole)["obs"])
    # the split made from the old data went with it
    assert not (root / (cartpole + "_split")).exists()
    split = load(cartpole, root, split_trajs=True, download=False)
    assert split[:].batch_size[0] == 3
    assert sorted(os.listdir(root / "cartpole")) == ["tiny-v0", "tiny-v0_split"]


def test_force_with_split_rebuilds_both(cartpole, root, count_conversions):
    load(cartpole, root, split_trajs=True)
    data = load(cartpole, root, split_trajs=True, download="force")
    assert count_conversions == [cartpole, cartpole]
    assert data[:].batch_size[0] == 5


def test_delete_removes_the_converted_files(cartpole, root, count_conversions):
    data = load(cartpole, root)
    sample = data.sample()
    data.delete()
    assert not data.data_path.exists() and not data.data_path_root.exists()
    assert root.exists() and tree(root) == []  # the namespace directory went too
    assert data.sample().batch_size == sample.batch_size  # what is mapped stays readable
    load(cartpole, root)
    assert count_conversions == [cartpole, cartpole]


# ---- download path ---------------------------------------------------------------------------
def test_download_fetches_with_minaris_function_and_keeps_only_the_conversion(
        minari_dir, root, tmp_path, fake_download, monkeypatch, cartpole_maker):
    remote, calls = fake_download
    make_remote(remote, monkeypatch, cartpole_maker)
    data = MinariExperienceReplay(CARTPOLE_ID, 4, root=root)
    assert [c["dataset_id"] for c in calls] == [CARTPOLE_ID]
    # Minari downloaded into a scratch directory beside the target, not into the local cache
    assert calls[0]["target"].is_relative_to(root / "cartpole")
    assert not minari_dir.exists() or tree(minari_dir) == []
    assert os.environ["MINARI_DATASETS_PATH"] == str(minari_dir)
    assert tree(root) == sorted(["cartpole", "cartpole/tiny-v0"] + [
        f"cartpole/tiny-v0/{p}" for p in tree(root / "cartpole" / "tiny-v0")])
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(remote))
    np.testing.assert_array_equal(data[:]["observation"].numpy(), expected_rows(CARTPOLE_ID)["obs"])
    np.testing.assert_array_equal(data[:]["next", "done"].numpy()[:, 0],
                                  expected_rows(CARTPOLE_ID)["terminated"]
                                  | expected_rows(CARTPOLE_ID)["truncated"])
    MinariExperienceReplay(CARTPOLE_ID, 4, root=root)
    assert len(calls) == 1  # converted data reused: no second download
    MinariExperienceReplay(CARTPOLE_ID, 4, root=root, download="force")
    assert len(calls) == 2


@pytest.mark.parametrize("error", [ConnectionError("Name or service not known"),
                                   OSError("network unreachable"),
                                   RuntimeError("HTTP transport failed")])
def test_failed_download_says_so_and_leaves_nothing(minari_dir, root, monkeypatch, error):
    def download_dataset(dataset_id, force_download=False):
        # half a download, then the failure
        target = minari.storage.datasets_root_dir.get_dataset_path(dataset_id)
        (target / "data").mkdir(parents=True)
        (target / "data" / "main_data.hdf5").write_bytes(b"\0" * 100)
        raise error

    monkeypatch.setattr(minari, "download_dataset", download_dataset)
    with pytest.raises(ConnectionError, match="could not download the Minari dataset "
                       "'cartpole/tiny-v0'.*network reachable") as info:
        MinariExperienceReplay(CARTPOLE_ID, 4, root=root)
    assert info.value.__cause__ is error
    assert not root.exists()
    assert os.environ["MINARI_DATASETS_PATH"] == str(minari_dir)


def test_failed_download_leaves_an_existing_root_as_it_was(cartpole, root, monkeypatch):
    load(cartpole, root)
    before = tree(root)

    def download_dataset(dataset_id, force_download=False):
        raise ConnectionError("offline")

    monkeypatch.setattr(minari, "download_dataset", download_dataset)
    with pytest.raises(ConnectionError):
        MinariExperienceReplay("other/ns/data-v1", 4, root=root)
    with pytest.raises(ConnectionError):  # force keeps the old data when the new one fails
        MinariExperienceReplay(cartpole, 4, root=root, download="force")
    assert tree(root) == before
    assert len(load(cartpole, root, download=False)) == len(expected_rows(cartpole)["obs"])


def test_dataset_missing_on_the_remote_is_a_value_error(minari_dir, root, fake_download):
    with pytest.raises(ValueError, match="Minari could not download the dataset 'nope/none-v0'"):
        MinariExperienceReplay("nope/none-v0", 4, root=root)
    assert not root.exists()


def test_failure_during_conversion_leaves_nothing(cartpole, root, monkeypatch):
    from tdreplay.datasets import _minari_ted

    calls = []
    convert = _minari_ted.episode_to_ted

    def failing(episode, dropped):
        calls.append(episode.id)
        if len(calls) == 3:
            raise RuntimeError("disk on fire")
        return convert(episode, dropped)

    monkeypatch.setattr(minari_data, "episode_to_ted", failing)
    with pytest.raises(RuntimeError, match="disk on fire"):
        load(cartpole, root)
    assert not root.exists()


# ---- local Minari cache ----------------------------------------------------------------------
def test_load_from_local_minari_never_downloads(cartpole, root, monkeypatch):
    def download_dataset(*args, **kwargs):
        raise AssertionError("load_from_local_minari must not download")

    monkeypatch.setattr(minari, "download_dataset", download_dataset)
    data = MinariExperienceReplay(cartpole, 4, root=root, load_from_local_minari=True)
    assert len(data) == len(expected_rows(cartpole)["obs"])


def test_missing_local_dataset_names_where_it_looked(minari_dir, root, monkeypatch):
    def download_dataset(*args, **kwargs):
        raise AssertionError("load_from_local_minari must not download")

    monkeypatch.setattr(minari, "download_dataset", download_dataset)
    with pytest.raises(FileNotFoundError, match="not in the local Minari cache") as info:
        MinariExperienceReplay("cartpole/absent-v0", 4, root=root, load_from_local_minari=True)
    assert str(minari_dir / "cartpole" / "absent-v0" / "data") in str(info.value)
    assert not root.exists()


def test_default_local_cache_is_home_minari(tmp_path, root, monkeypatch):
    monkeypatch.delenv("MINARI_DATASETS_PATH", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    with pytest.raises(FileNotFoundError) as info:
        MinariExperienceReplay("x/y-v0", 4, root=root, load_from_local_minari=True)
    assert str(tmp_path / "home" / ".minari" / "datasets" / "x" / "y-v0" / "data") in str(info.value)


def test_download_false_needs_the_converted_data(minari_dir, root):
    with pytest.raises(FileNotFoundError, match="not converted under root") as info:
        MinariExperienceReplay(CARTPOLE_ID, 4, root=root, download=False)
    assert str(root / CARTPOLE_ID) in str(info.value)


def test_default_root(cartpole, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    data = MinariExperienceReplay(cartpole, 4, load_from_local_minari=True)
    assert data.data_path == tmp_path / "home" / ".cache" / "tdreplay" / "minari" / cartpole
    assert (data.data_path / "tdreplay-dataset.json").is_file()


# ---- available datasets ----------------------------------------------------------------------
def test_available_datasets_lists_the_remote(monkeypatch):
    monkeypatch.setattr(minari, "list_remote_datasets",
                        lambda: {"b/x-v0": {}, "D4RL/door/human-v2": {}, "a/y-v1": {}})
    assert MinariExperienceReplay.available_datasets == ["D4RL/door/human-v2", "a/y-v1", "b/x-v0"]


def test_available_datasets_offline_is_a_connection_error(monkeypatch):
    def offline():
        raise OSError("Temporary failure in name resolution")

    monkeypatch.setattr(minari, "list_remote_datasets", offline)
    with pytest.raises(ConnectionError, match="could not list Minari's remote datasets.*network"):
        _ = MinariExperienceReplay.available_datasets


def test_available_datasets_without_network_really_fails(monkeypatch):
    # no monkeypatched Minari: its real remote listing meets the blocked network
    try:
        import huggingface_hub  # noqa: F401
    except ImportError:
        expected = ImportError
    else:
        expected = ConnectionError
    with pytest.raises(expected):
        _ = MinariExperienceReplay.available_datasets


def test_instances_see_available_datasets(cartpole, root, monkeypatch):
    monkeypatch.setattr(minari, "list_remote_datasets", lambda: {"a/b-v0": {}})
    assert load(cartpole, root).available_datasets == ["a/b-v0"]


# ---- buffer behaviour and arguments ----------------------------------------------------------
def test_defaults_and_writes_refused(cartpole, root):
    data = load(cartpole, root, batch_size=5)
    assert isinstance(data.sampler, RandomSampler)
    assert isinstance(data.writer, ImmutableDatasetWriter)
    assert data.batch_size == 5
    n = len(data)
    with pytest.raises(RuntimeError, match="immutable dataset"):
        data.extend(data[:3])
    assert len(data) == n and data.write_count == 0


def test_transform_and_components_are_used(cartpole, root):
    from tdreplay.samplers import SamplerWithoutReplacement

    def double_reward(td):
        td.set(("next", "reward"), td.get(("next", "reward")) * 2)
        return td

    data = load(cartpole, root, batch_size=len(expected_rows(cartpole)["obs"]),
                sampler=SamplerWithoutReplacement(), transform=double_reward)
    sample = data.sample()
    assert sorted(sample["index"].tolist()) == list(range(len(data)))
    assert (sample["next", "reward"] == 2).all()  # CartPole rewards are all 1
    assert (data[:]["next", "reward"] == 2).all()


def test_progress_bar_during_conversion(cartpole, root, capfd):
    load(cartpole, root)
    assert f"converting {cartpole}" in capfd.readouterr().err
    load(cartpole, root)
    assert "converting" not in capfd.readouterr().err


@pytest.mark.parametrize("download", ["yes", None, 1, "Force"])
def test_bad_download_argument(download, root):
    with pytest.raises(ValueError, match="download must be True, False or 'force'"):
        MinariExperienceReplay(CARTPOLE_ID, 4, root=root, download=download)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"batch_size": 0}, ValueError, "batch_size must be >= 1, got 0"),
    ({"batch_size": 2.0}, TypeError, "batch_size must be an int or None, got float"),
    ({"batch_size": True}, TypeError, "batch_size must be an int or None, got bool"),
    ({"sampler": "random"}, TypeError, "sampler must be a Sampler"),
    ({"writer": object()}, TypeError, "writer must be a Writer"),
])
def test_bad_buffer_arguments_fail_before_converting(cartpole, root, count_conversions, kwargs,
                                                      error, match):
    kwargs = {"batch_size": 4, **kwargs}
    with pytest.raises(error, match=match):
        MinariExperienceReplay(cartpole, root=root, load_from_local_minari=True, **kwargs)
    assert count_conversions == [] and not root.exists()


@pytest.mark.parametrize("bad_root", [5, ["a"], 1.5])
def test_a_root_that_is_not_a_path_is_refused_naming_it(cartpole, bad_root):
    with pytest.raises(TypeError, match="root must be a str, a path or None"):
        MinariExperienceReplay(cartpole, 4, root=bad_root, load_from_local_minari=True)


def test_a_root_that_is_a_file_is_refused_naming_it(cartpole, tmp_path):
    # (it raised NotADirectoryError for '<file>/<dataset id>' from deep inside the conversion)
    a_file = tmp_path / "notes.txt"
    a_file.write_text("not a directory")
    with pytest.raises(NotADirectoryError, match=r"root must be a directory.*notes\.txt'\."):
        MinariExperienceReplay(cartpole, 4, root=a_file, load_from_local_minari=True)
    assert a_file.read_text() == "not a directory"


@pytest.mark.parametrize("dataset_id", ["../escape-v0", "a//b-v0", "/abs/x-v0", "a/./b", ""])
def test_bad_dataset_ids(dataset_id, root):
    with pytest.raises((ValueError, TypeError), match="dataset_id"):
        MinariExperienceReplay(dataset_id, 4, root=root)
    assert not root.exists()


def test_foreign_directory_is_not_taken_for_a_dataset(cartpole, root):
    (root / cartpole).mkdir(parents=True)
    load(cartpole, root)  # an empty directory is just a missing dataset
    shutil.rmtree(root / cartpole)
    (root / cartpole).mkdir(parents=True)
    (root / cartpole / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="holds no dataset converted"):
        load(cartpole, root)
    assert (root / cartpole / "notes.txt").read_text() == "mine"
    data = load(cartpole, root, download="force")
    assert len(data) == len(expected_rows(cartpole)["obs"])
    assert not (root / cartpole / "notes.txt").exists()


def test_dict_dataset_split(dict_dataset, root):
    data = load(dict_dataset, root, split_trajs=True, batch_size=2)
    sample = data.sample()
    assert sample["observation", "position"].shape[:2] == sample["mask"].shape
    assert sample["next", "info", "distance"].shape == sample["mask"].shape

