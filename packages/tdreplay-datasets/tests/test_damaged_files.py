"""Damaged converted datasets and Minari sources are refused naming the file; disk unchanged."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

from tdreplay.datasets import MinariExperienceReplay

MARKER = "tdreplay-dataset.json"


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
