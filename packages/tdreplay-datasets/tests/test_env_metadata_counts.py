"""The counts ``env_metadata.json`` declares (``total_steps``, ``total_episodes``: what
``metadata_path`` hands to TorchRL code) are checked against the data on every load: a
damaged or hand-edited file was loaded without a word while only the marker's counts were
checked. Refused naming the file and the field; nothing loaded, nothing on disk changed."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest

from tdreplay.datasets import MinariExperienceReplay

ENV_METADATA = "env_metadata.json"


def load(dataset_id: str, root: Path, **kwargs) -> MinariExperienceReplay:
    kwargs.setdefault("load_from_local_minari", True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return MinariExperienceReplay(dataset_id, 4, root=root, **kwargs)


def snapshot(path: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()
    }


def edit(path: Path, **changes) -> dict:
    meta = json.loads(path.read_text())
    for key, value in changes.items():
        if value is KeyError:
            del meta[key]
        else:
            meta[key] = value
    path.write_text(json.dumps(meta))
    return meta


@pytest.fixture
def converted(cartpole, root) -> Path:
    """The converted cartpole dataset (flat and split: 5 episodes), its flat directory."""
    load(cartpole, root, split_trajs=True)
    return root / cartpole


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
