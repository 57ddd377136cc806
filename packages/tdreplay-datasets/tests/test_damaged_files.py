"""Damaged converted datasets and Minari sources are refused naming the file; disk unchanged."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch

from tdreplay.datasets import MinariExperienceReplay

MARKER = "tdreplay-dataset.json"
ENV_METADATA = "env_metadata.json"


def load(dataset_id: str, root: Path, **kwargs) -> MinariExperienceReplay:
    kwargs.setdefault("load_from_local_minari", True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return MinariExperienceReplay(dataset_id, 4, root=root, **kwargs)


def snapshot(path: Path) -> dict[str, bytes]:
    """Every file under ``path`` and its bytes."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file()}


def truncate(path: Path, size: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)


@pytest.fixture
def converted(cartpole, root) -> Path:
    """The converted cartpole dataset (flat and split), its directory under root."""
    load(cartpole, root, split_trajs=True)
    return root / cartpole


@pytest.mark.parametrize("split", [False, True], ids=["flat", "split"])
@pytest.mark.parametrize("leaf", ["observation.memmap", "next/reward.memmap", "episode.memmap"])
def test_truncated_leaf_file_is_refused_naming_it(cartpole, root, converted, split, leaf):
    where = Path(str(converted) + "_split") if split else converted
    path = where / "data" / leaf
    size = path.stat().st_size
    truncate(path, size // 2)
    before = snapshot(root)
    with pytest.raises(ValueError, match=f"{leaf}.*holds {size // 2} bytes, but its entry "
                                         f"needs {size}: the file is truncated"):
        load(cartpole, root, download=False, split_trajs=split)
    assert snapshot(root) == before  # not zero-extended, nothing rebuilt
    assert path.stat().st_size == size // 2


@pytest.mark.parametrize("leaf", ["action.memmap", "next/done.memmap"])
def test_missing_leaf_file_is_refused_naming_it(cartpole, root, converted, leaf):
    (converted / "data" / leaf).unlink()
    before = snapshot(root)
    with pytest.raises(ValueError, match=f"{leaf}' is missing"):
        load(cartpole, root, download=False)
    assert snapshot(root) == before


def test_a_leaf_left_out_of_meta_json_is_refused(cartpole, root, converted):
    meta_path = converted / "data" / "next" / "meta.json"
    meta = json.loads(meta_path.read_text())
    del meta["reward"]
    meta_path.write_text(json.dumps(meta))
    (converted / "data" / "next" / "reward.memmap").unlink()
    before = snapshot(root)
    with pytest.raises(ValueError, match="does not declare the leaf 'next/reward.memmap'"):
        load(cartpole, root, download=False)
    assert snapshot(root) == before


def test_a_leaf_added_to_meta_json_is_refused(cartpole, root, converted):
    # (an entry added by hand, with its file, loaded as an extra entry of the dataset)
    import shutil

    meta_path = converted / "data" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["extra"] = meta["action"]
    meta_path.write_text(json.dumps(meta))
    shutil.copy(converted / "data" / "action.memmap", converted / "data" / "extra.memmap")
    before = snapshot(root)
    with pytest.raises(ValueError, match=r"declares leaves the conversion did not write "
                       r"\(\['extra.memmap'\]\)"):
        load(cartpole, root, download=False)
    assert snapshot(root) == before


def test_a_marker_whose_file_table_is_not_a_table_is_refused(cartpole, root, converted):
    # (a list in place of the table skipped the check of the leaves without a word; a marker
    # without the table is one of an older version, still checked leaf by leaf)
    path = converted / MARKER
    marker = json.loads(path.read_text())
    marker["files"] = list(marker["files"])
    path.write_text(json.dumps(marker))
    before = snapshot(root)
    with pytest.raises(ValueError, match="table of leaf files .* is damaged"):
        load(cartpole, root, download=False)
    assert snapshot(root) == before


def test_longer_leaf_file_is_refused(cartpole, root, converted):
    path = converted / "data" / "action.memmap"
    with open(path, "ab") as f:
        f.write(b"\0" * 8)
    with pytest.raises(ValueError, match="action.memmap.*the file is damaged"):
        load(cartpole, root, download=False)


@pytest.mark.parametrize("damage", ["garbage", "empty", "list", "missing"])
def test_damaged_meta_json_is_refused_naming_it(cartpole, root, converted, damage):
    path = converted / "data" / "meta.json"
    if damage == "missing":
        path.unlink()
    else:
        path.write_text({"garbage": "{\"observation\": {\"sha", "empty": "",
                         "list": "[1, 2]"}[damage])
    before = snapshot(root)
    with pytest.raises(ValueError, match=f"{path}' is (damaged|missing)"):
        load(cartpole, root, download=False)
    assert snapshot(root) == before


@pytest.mark.parametrize("damage", ["type key", "device"])
def test_a_meta_json_that_parses_but_describes_no_tensordict_is_refused(cartpole, root,
                                                                         converted, damage):
    """Valid JSON of another content raised a raw KeyError or torch's device error."""
    path = converted / "data" / "meta.json"
    text = path.read_text()
    path.write_text(text.replace('"_type"', '"^type"') if damage == "type key"
                    else text.replace('"device": "cpu"', '"device": "bpu"'))
    before = snapshot(root)
    with pytest.raises(ValueError, match=f"the converted data under '{path.parent}' is damaged"):
        load(cartpole, root, download=False)
    assert snapshot(root) == before


@pytest.mark.parametrize("meta_file, leaf", [("meta.json", "observation"),
                                             ("next/meta.json", "reward")])
def test_a_leaf_shape_edited_to_the_same_bytes_is_refused_naming_it(cartpole, root, converted,
                                                                    meta_file, leaf):
    """(the storage built on the data raised tensordict's bare "batch dimension mismatch")"""
    path = converted / "data" / meta_file
    meta = json.loads(path.read_text())
    shape = meta[leaf]["shape"]
    size = 1
    for dim in shape:
        size *= dim
    meta[leaf]["shape"] = [1, size]  # the same number of elements, another batch size
    path.write_text(json.dumps(meta))
    before = snapshot(root)
    with pytest.raises(ValueError, match=f"the converted data under '{converted / 'data'}' is "
                       f"damaged.*{leaf}.*does not start with the data's batch size"):
        load(cartpole, root, download=False)
    assert snapshot(root) == before


def test_a_damaged_space_in_the_marker_is_refused_naming_it(cartpole, root, converted):
    path = converted / MARKER
    marker = json.loads(path.read_text())
    marker["observation_space"] = marker["observation_space"][:-1]  # (a JSON string cut short)
    path.write_text(json.dumps(marker))
    with pytest.raises(ValueError, match=f"observation_space in the dataset marker file '{path}'"):
        _ = load(cartpole, root, download=False).metadata


@pytest.mark.parametrize("damage", ["garbage", "binary", "list"])
def test_damaged_marker_is_refused_naming_it(cartpole, root, converted, damage):
    path = converted / MARKER
    path.write_bytes({"garbage": b'{"format": 1, "data', "binary": bytes(range(256)),
                      "list": b"[]"}[damage])
    before = snapshot(root)
    with pytest.raises(ValueError, match=f"the dataset marker file '{path}' is damaged"):
        load(cartpole, root, download=False)
    assert snapshot(root) == before


@pytest.mark.parametrize("split", [False, True], ids=["flat", "split"])
@pytest.mark.parametrize("edit, match", [
    # (hand-edited counts loaded: len(data) 16 while metadata said total_steps 10)
    ({"total_steps": 10}, "it declares total_steps = 10, but the data under '{data}' holds "
                          "{steps} steps"),
    ({"total_steps": "+1"}, "it declares total_steps = {steps1}, but the data"),
    ({"total_episodes": 2}, "it declares total_episodes = 2, but the data under '{data}' holds "
                            "5 episodes"),
    ({"total_episodes": 6}, "it declares total_episodes = 6, but the data under '{data}' holds "
                            "5 episodes"),
    ({"total_steps": "16"}, "its total_steps is '16', not a count"),
    ({"total_episodes": None}, "its total_episodes is None, not a count"),
    ({"empty_episodes": 1}, "it declares total_episodes = 5, but the data under '{data}' holds "
                            "5 episodes and 1 without steps"),
])
def test_counts_edited_in_the_marker_are_refused_naming_it(cartpole, root, converted, split,
                                                          edit, match):
    where = Path(str(converted) + "_split") if split else converted
    path = where / MARKER
    marker = json.loads(path.read_text())
    steps = marker["total_steps"]
    if edit.get("total_steps") == "+1":
        edit = {"total_steps": steps + 1}
    marker.update(edit)
    path.write_text(json.dumps(marker))
    before = snapshot(root)
    message = match.format(data=where / "data", steps=steps, steps1=steps + 1)
    with pytest.raises(ValueError) as err:
        load(cartpole, root, download=False, split_trajs=split)
    assert str(err.value).startswith(f"the dataset marker file '{path}' is damaged: {message}")
    assert snapshot(root) == before


def test_a_max_len_edited_in_a_split_marker_is_refused(cartpole, root, converted):
    path = Path(str(converted) + "_split") / MARKER
    marker = json.loads(path.read_text())
    marker["max_len"] -= 1
    path.write_text(json.dumps(marker))
    before = snapshot(root)
    with pytest.raises(ValueError, match=f"marker file '{path}' is damaged: it declares max_len "
                                         f"= {marker['max_len']}, but the data under .* holds "
                                         f"episodes padded to {marker['max_len'] + 1} steps"):
        load(cartpole, root, download=False, split_trajs=True)
    assert snapshot(root) == before


def test_a_split_is_not_made_from_a_conversion_whose_counts_were_edited(cartpole, root):
    load(cartpole, root)
    path = root / cartpole / MARKER
    marker = json.loads(path.read_text())
    marker["total_steps"] += 3
    path.write_text(json.dumps(marker))
    before = snapshot(root)
    with pytest.raises(ValueError, match=f"marker file '{path}' is damaged: it declares "
                                         "total_steps"):
        load(cartpole, root, download=False, split_trajs=True)
    assert snapshot(root) == before


def test_counts_of_a_conversion_without_empty_episodes_entry_are_still_checked(cartpole, root,
                                                                              converted):
    path = converted / MARKER
    marker = json.loads(path.read_text())
    del marker["empty_episodes"]  # converted by an earlier version
    path.write_text(json.dumps(marker))
    data = load(cartpole, root, download=False)
    assert data.metadata["total_episodes"] == 5 and "empty_episodes" not in data.metadata
    del data
    marker["total_episodes"] = 4
    path.write_text(json.dumps(marker))
    with pytest.raises(ValueError, match="total_episodes = 4, but .* holds 5 episodes"):
        load(cartpole, root, download=False)


def test_an_episode_without_steps_counts_in_total_episodes(minari_dir, root):
    # (Minari writes no such episode, but reads one: the conversion skips it, Minari's
    # total_episodes counts it)
    import gymnasium as gym
    import h5py
    import minari
    import numpy as np
    from minari.data_collector import EpisodeBuffer

    def episode(i, n):
        return EpisodeBuffer(id=i, observations=np.full((n + 1, 4), i, np.float32),
                             actions=np.zeros(n, np.int64), rewards=np.ones(n),
                             terminations=np.arange(n) == n - 1, truncations=np.zeros(n, bool))

    env = gym.make("CartPole-v1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        minari.create_dataset_from_buffers(
            "gap/tiny-v0", [episode(0, 3), episode(1, 2), episode(2, 1)],
            observation_space=env.observation_space, action_space=env.action_space,
            algorithm_name="scripted")
    data_dir = source_dir(minari_dir, "gap/tiny-v0")
    with h5py.File(data_dir / "main_data.hdf5", "r+") as h5:
        group = h5["episode_1"]
        for key, keep in (("actions", 0), ("rewards", 0), ("terminations", 0),
                          ("truncations", 0), ("observations", 1)):
            values = group[key][()]
            del group[key]
            group[key] = values[:keep]
        group.attrs["total_steps"] = 0
    meta = json.loads((data_dir / "metadata.json").read_text())
    meta["total_steps"] = 4
    (data_dir / "metadata.json").write_text(json.dumps(meta))
    for split in (False, True):
        load("gap/tiny-v0", root, split_trajs=split)
        again = load("gap/tiny-v0", root, download=False, split_trajs=split)
        assert len(again) == (2 if split else 4)
        assert (again.metadata["total_episodes"], again.metadata["total_steps"]) == (3, 4)


def test_damaged_flat_data_is_refused_when_splitting(cartpole, root):
    load(cartpole, root)
    path = root / cartpole / "data" / "observation.memmap"
    truncate(path, 3)
    before = snapshot(root)
    with pytest.raises(ValueError, match="observation.memmap"):
        load(cartpole, root, download=False, split_trajs=True)
    assert snapshot(root) == before
    assert not Path(str(root / cartpole) + "_split").exists()


def test_force_converts_a_damaged_dataset_again(cartpole, root, converted):
    good = load(cartpole, root, download=False)
    expected = good[:]["observation"].clone()
    del good
    truncate(converted / "data" / "observation.memmap", 10)
    data = load(cartpole, root, download="force")
    assert torch.equal(data[:]["observation"], expected)


def test_the_marker_records_every_leaf_file_and_its_size(converted):
    files = json.loads((converted / MARKER).read_text())["files"]
    data = converted / "data"
    on_disk = {str(p.relative_to(data)): p.stat().st_size for p in data.rglob("*.memmap")}
    assert files == on_disk
    assert files["observation.memmap"] == files["next/observation.memmap"] > 0


def test_metadata_does_not_show_the_file_table(cartpole, root, converted):
    assert "files" not in load(cartpole, root, download=False).metadata


def test_dataset_converted_without_a_file_table_is_still_checked(cartpole, root, converted):
    marker = converted / MARKER
    meta = json.loads(marker.read_text())
    del meta["files"]  # converted by an older version
    marker.write_text(json.dumps(meta))
    data = load(cartpole, root, download=False)
    assert len(data) == data.metadata["total_steps"]
    del data
    truncate(converted / "data" / "action.memmap", 8)
    with pytest.raises(ValueError, match="action.memmap"):
        load(cartpole, root, download=False)


# ---- the Minari source -----------------------------------------------------------------------
def source_dir(minari_dir: Path, dataset_id: str) -> Path:
    return minari_dir / dataset_id / "data"


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty"])
def test_garbage_hdf5_is_refused_naming_it(cartpole, minari_dir, root, damage):
    path = source_dir(minari_dir, cartpole) / "main_data.hdf5"
    data = path.read_bytes()
    path.write_bytes({"garbage": b"not an hdf5 file" * 100, "truncated": data[:len(data) // 3],
                      "empty": b""}[damage])
    with pytest.raises(ValueError, match=f"'{path}' is damaged or not a Minari dataset file"):
        load(cartpole, root)
    assert not root.exists()


def test_damaged_minari_metadata_is_refused_naming_it(cartpole, minari_dir, root):
    path = source_dir(minari_dir, cartpole) / "metadata.json"
    path.write_text('{"dataset_id": "cartp')
    with pytest.raises(ValueError, match=f"'{path}' is damaged or not a Minari dataset file"):
        load(cartpole, root)
    assert not root.exists()


def test_a_missing_minari_metadata_is_refused_naming_it(cartpole, minari_dir, root):
    # (the error named main_data.hdf5 as damaged: Minari reads nothing without metadata.json)
    path = source_dir(minari_dir, cartpole) / "metadata.json"
    path.unlink()
    with pytest.raises(ValueError, match=f"its metadata.json is missing \\('{path}'\\)"):
        load(cartpole, root)
    assert not root.exists()


def test_a_good_dataset_is_unchanged_by_loading(cartpole, root, converted):
    before = snapshot(root)
    data = load(cartpole, root, download=False, split_trajs=True)
    assert data.sample()["mask"].shape[0] == 4
    assert snapshot(root) == before


@pytest.mark.parametrize("at", [i / 16 for i in range(1, 16)])
def test_a_block_of_zeros_in_the_hdf5_is_refused_naming_it_or_read(cartpole, minari_dir, root,
                                                                   at):
    # HDF5 structures zeroed in the middle: h5py raised a bare RuntimeError ("free block size
    # is zero?") for some offsets, naming no file
    path = source_dir(minari_dir, cartpole) / "main_data.hdf5"
    data = bytearray(path.read_bytes())
    start = int(len(data) * at)
    data[start:start + 4096] = bytes(min(4096, len(data) - start))
    path.write_bytes(bytes(data))
    try:
        loaded = load(cartpole, root)
    except ValueError as err:
        assert f"'{path}' is damaged or not a Minari dataset file" in str(err)
        assert not root.exists()
    else:  # (zeros where only data was: read as zeros, as h5py reads them)
        assert len(loaded) > 0


@pytest.mark.parametrize("entry, extra", [("rewards", 1), ("actions", 1), ("rewards", -1)])
def test_an_episode_whose_entries_disagree_in_length_is_named_with_its_file(
        cartpole, minari_dir, root, entry, extra):
    # (the step count was taken from len(rewards): the error blamed 'observations', and named
    # neither the episode, the dataset nor the file)
    import h5py
    import numpy as np

    path = source_dir(minari_dir, cartpole) / "main_data.hdf5"
    with h5py.File(path, "r+") as h5:
        steps = len(h5["episode_3/rewards"])
        values = h5[f"episode_3/{entry}"][()]
        del h5[f"episode_3/{entry}"]
        h5[f"episode_3/{entry}"] = np.resize(values, (steps + extra, *values.shape[1:]))
    with pytest.raises(ValueError) as err:
        load(cartpole, root)
    message = str(err.value)
    assert message.startswith(f"episode 3 of the Minari dataset {cartpole!r} (group 'episode_3' "
                              f"of the file '{path}') is damaged: its entries disagree in length")
    assert f"{entry!r} has shape ({steps + extra}," in message
    assert f"the other entries give {steps} steps (observations {steps + 1} (= steps + 1)" \
        in message
    assert not root.exists()


# ---- the counts env_metadata.json declares --------------------------------------------------
# The counts ``env_metadata.json`` declares (``total_steps``, ``total_episodes``: what
# ``metadata_path`` hands to TorchRL code) are checked against the data on every load: a
# damaged or hand-edited file was loaded without a word while only the marker's counts were
# checked. Refused naming the file and the field; nothing loaded, nothing on disk changed.
def edit(path: Path, **changes) -> dict:
    meta = json.loads(path.read_text())
    for key, value in changes.items():
        if value is KeyError:
            del meta[key]
        else:
            meta[key] = value
    path.write_text(json.dumps(meta))
    return meta


@pytest.mark.parametrize("split", [False, True], ids=["flat", "split"])
@pytest.mark.parametrize(
    "field, value, says",
    [
        (
            "total_steps",
            10,
            "it declares total_steps = 10, but the data under '{data}' holds {steps} steps",
        ),
        (
            "total_steps",
            "+1",
            "it declares total_steps = {steps1}, but the data under '{data}' holds {steps} steps",
        ),
        (
            "total_episodes",
            4,
            "it declares total_episodes = 4, but the data under '{data}' holds 5 episodes",
        ),
        (
            "total_episodes",
            6,
            "it declares total_episodes = 6, but the data under '{data}' holds 5 episodes",
        ),
        ("total_steps", "16", "its total_steps is '16', not a count"),
        ("total_episodes", 5.0, "its total_episodes is 5.0, not a count"),
        ("total_episodes", True, "its total_episodes is True, not a count"),
        ("total_steps", KeyError, "it has no total_steps entry"),
    ],
)
def test_counts_edited_in_env_metadata_are_refused_naming_the_file_and_field(
    cartpole, root, converted, split, field, value, says
):
    path = converted / ENV_METADATA
    steps = json.loads(path.read_text())["total_steps"]
    edit(path, **{field: steps + 1 if value == "+1" else value})
    before = snapshot(root)
    data_dir = Path(str(converted) + "_split" if split else converted) / "data"
    with pytest.raises(ValueError) as err:
        load(cartpole, root, download=False, split_trajs=split)
    message = says.format(data=data_dir, steps=steps, steps1=steps + 1)
    assert str(err.value) == (
        f"the environment metadata file '{path}' is damaged: {message}; nothing was loaded. "
        "Remove the dataset (or pass download='force') to convert it again."
    )
    assert snapshot(root) == before  # nothing converted again, nothing rewritten


def test_a_correct_env_metadata_loads_as_before(cartpole, root, converted):
    written = json.loads((converted / ENV_METADATA).read_text())
    for split in (False, True):
        data = load(cartpole, root, download=False, split_trajs=split)
        assert (written["total_steps"], written["total_episodes"]) == (
            data.metadata["total_steps"],
            data.metadata["total_episodes"],
        )
        assert written["total_episodes"] == 5
        assert data.metadata_path == converted / ENV_METADATA
    assert len(load(cartpole, root, download=False)) == written["total_steps"]


def test_other_env_metadata_entries_are_not_checked(cartpole, root, converted):
    # (only the counts are compared with the data; e.g. a path edited by hand still loads)
    edit(converted / ENV_METADATA, data_path="/elsewhere", combined_datasets=["x"])
    data = load(cartpole, root, download=False)
    assert len(data) == data.metadata["total_steps"]


def test_a_split_is_not_made_from_a_conversion_whose_env_metadata_was_edited(cartpole, root):
    load(cartpole, root)
    path = root / cartpole / ENV_METADATA
    edit(path, total_episodes=7)
    before = snapshot(root)
    with pytest.raises(
        ValueError,
        match=f"environment metadata file '{path}' is damaged: it "
        "declares total_episodes = 7, but .* holds 5 "
        "episodes",
    ):
        load(cartpole, root, download=False, split_trajs=True)
    assert snapshot(root) == before
    assert not (root / (cartpole + "_split")).exists()


def test_a_split_whose_flat_conversion_was_deleted_loads_on_its_own(cartpole, root, converted):
    shutil.rmtree(converted)
    data = load(cartpole, root, download=False, split_trajs=True, load_from_local_minari=False)
    assert data.metadata["total_episodes"] == 5 and len(data) == 5


def test_a_damaged_env_metadata_of_the_flat_conversion_refuses_its_split(cartpole, root, converted):
    path = converted / ENV_METADATA
    path.write_text("{not json")
    before = snapshot(root)
    with pytest.raises(ValueError, match=f"environment metadata file '{path}' is damaged"):
        load(cartpole, root, download=False, split_trajs=True)
    path.unlink()
    with pytest.raises(ValueError, match=f"environment metadata file '{path}' is missing"):
        load(cartpole, root, download=False, split_trajs=True)
    assert snapshot(root) == {
        k: v for k, v in before.items() if k != f"{Path(cartpole)}/{ENV_METADATA}"
    }


def test_a_conversion_with_episodes_without_steps_checks_them_in(cartpole, root, converted):
    # total_episodes counts the episodes without steps the conversion skipped (Minari's
    # count); the marker records them as empty_episodes
    marker = converted / "tdreplay-dataset.json"
    edit(marker, empty_episodes=2, total_episodes=7)
    edit(converted / ENV_METADATA, total_episodes=7)
    assert load(cartpole, root, download=False).metadata["total_episodes"] == 7
    edit(converted / ENV_METADATA, total_episodes=5)
    with pytest.raises(
        ValueError,
        match=r"declares total_episodes = 5, but the data under .* "
        r"holds 5 episodes and 2 without steps",
    ):
        load(cartpole, root, download=False)


def test_force_converts_a_refused_dataset_again(cartpole, root, converted):
    edit(converted / ENV_METADATA, total_steps=1)
    with pytest.raises(ValueError, match="total_steps = 1"):
        load(cartpole, root, download=False)
    data = load(cartpole, root, download="force")
    written = json.loads((converted / ENV_METADATA).read_text())
    assert written["total_steps"] == len(data) != 1
