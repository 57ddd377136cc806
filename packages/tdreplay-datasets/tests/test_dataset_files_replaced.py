"""What reads a dataset buffer's files by path (a pickled or deep-copied buffer, which maps
them again; ``preprocess``'s worker processes) refuses files other than those the buffer
maps: replaced by a new conversion of the same dataset, or, for spawned workers, rows written
or restored into the buffer in this process. Each read other data than the buffer, silently."""

from __future__ import annotations

import copy
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ListStorage
from tdreplay.datasets import BaseDatasetExperienceReplay, OfflineToOnlineReplayBuffer
from tdreplay.datasets._parallel_map import load_memmap


class OnDisk(BaseDatasetExperienceReplay):
    def __init__(self, root: Path, **kwargs):
        self.root = root
        super().__init__(load_memmap(root / "set"), **kwargs)  # (copy-on-write, as Minari's)

    @property
    def data_path(self) -> Path:
        return self.root / "set"

    data_path_root = data_path


def convert(root: Path, values: torch.Tensor) -> None:
    """Write ``values`` as the dataset's files, replacing any there as a conversion does
    (built beside, renamed into place)."""
    TensorDict({"x": values, "y": -values}, [len(values)]).memmap(root / "scratch")
    if (root / "set").exists():
        shutil.rmtree(root / "set")
    os.rename(root / "scratch", root / "set")


def double(td):
    return td.set("x", 2 * td["x"])


@pytest.fixture
def dataset(tmp_path):
    convert(tmp_path, torch.arange(8.0))
    return OnDisk(tmp_path, batch_size=4)


def test_copies_of_a_buffer_over_unchanged_files_read_its_rows(dataset):
    for twin in (pickle.loads(pickle.dumps(dataset)), copy.deepcopy(dataset)):
        assert torch.equal(twin[:]["x"], torch.arange(8.0))


@pytest.mark.parametrize("values", [torch.arange(100.0, 108.0), torch.arange(3.0)],
                         ids=["same-size", "smaller"])
def test_a_copy_after_a_new_conversion_is_refused(dataset, tmp_path, values):
    convert(tmp_path, values)  # same id, new data (the copy read it, or failed in tensordict)
    assert torch.equal(dataset[:]["x"], torch.arange(8.0))  # the buffer still maps its files
    with pytest.raises(RuntimeError, match=r"files were replaced or removed.*x\.memmap"):
        pickle.loads(pickle.dumps(dataset))
    with pytest.raises(RuntimeError, match="a copy of it would read them by path"):
        copy.deepcopy(dataset)


def test_preprocess_workers_after_a_new_conversion_are_refused(dataset, tmp_path):
    convert(tmp_path, torch.arange(100.0, 108.0))
    with pytest.raises(RuntimeError, match="preprocess's 2 worker processes"):
        dataset.preprocess(double, num_workers=2, mp_start_method="fork", chunksize=2,
                           dest=tmp_path / "out")
    assert not (tmp_path / "out").exists()
    # in this process, the rows it maps
    storage = dataset.preprocess(double, num_workers=0, dest=tmp_path / "out")
    assert torch.equal(storage[:]["x"], 2 * torch.arange(8.0))


def test_spawned_preprocess_workers_after_rows_restored_in_this_process_are_refused(
        dataset, tmp_path):
    dataset.storage.set(0, TensorDict({"x": torch.tensor(50.0), "y": torch.tensor(-50.0)}, []))
    with pytest.raises(RuntimeError, match=r"'spawn' start method.*num_workers=0"):
        dataset.preprocess(double, num_workers=1, mp_start_method="spawn", dest=tmp_path / "o")
    assert not (tmp_path / "o").exists()
    storage = dataset.preprocess(double, num_workers=0, dest=tmp_path / "o")
    assert storage[:]["x"].tolist() == [100.0, *(2 * torch.arange(1.0, 8.0)).tolist()]


def test_the_datasets_own_storage_is_refused_as_online_storage(dataset):
    with pytest.raises(ValueError, match="online_storage is the offline dataset's own storage"):
        OfflineToOnlineReplayBuffer(dataset, online_storage=dataset.storage, batch_size=4)
    mixed = OfflineToOnlineReplayBuffer(dataset, online_storage=ListStorage(4), batch_size=4)
    assert len(mixed.online_buffer) == 0
