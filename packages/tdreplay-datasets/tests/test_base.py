"""BaseDatasetExperienceReplay over hand-made data."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import RandomSampler
from tdreplay.datasets import BaseDatasetExperienceReplay
from tdreplay.writers import ImmutableDatasetWriter


class OnDisk(BaseDatasetExperienceReplay):
    def __init__(self, root: Path, data: TensorDict, **kwargs):
        self.root = root
        super().__init__(data.memmap(root / "set" / "split"), **kwargs)

    @property
    def data_path(self) -> Path:
        return self.root / "set" / "split"

    @property
    def data_path_root(self) -> Path:
        return self.root / "set"


def episodes_td(num=4, length=5):
    return TensorDict({"obs": torch.arange(num * length * 2.0).reshape(num, length, 2),
                       "mask": torch.ones(num, length, dtype=torch.bool)}, [num, length])


def test_defaults():
    data = BaseDatasetExperienceReplay(TensorDict({"x": torch.arange(6)}, [6]), batch_size=2)
    assert isinstance(data.sampler, RandomSampler)
    assert isinstance(data.writer, ImmutableDatasetWriter)
    assert len(data) == 6
    sample = data.sample()
    assert (sample["x"] == sample["index"]).all()
    with pytest.raises(RuntimeError, match="immutable dataset"):
        data.add(TensorDict({"x": torch.tensor(1)}, []))
    assert len(data) == 6 and data.write_count == 0


def test_paths_must_be_defined_by_subclasses():
    data = BaseDatasetExperienceReplay(TensorDict({"x": torch.arange(3)}, [3]))
    with pytest.raises(NotImplementedError, match="data_path"):
        _ = data.data_path
    with pytest.raises(NotImplementedError, match="data_path_root"):
        _ = data.data_path_root


def test_rows_with_inner_batch_dims_sample_whole():
    data = BaseDatasetExperienceReplay(episodes_td(), batch_size=3)
    sample = data.sample()
    assert sample.batch_size == (3, 5)
    assert sample["index"].shape == (3, 5)
    for i in range(3):
        assert torch.equal(sample["obs"][i], episodes_td()["obs"][int(sample["index"][i, 0])])
    assert data[:].batch_size == (4, 5)
    assert data[torch.tensor([1, 2])].batch_size == (2, 5)


def test_user_collate_replaces_the_default():
    # the storage reads rows back with their inner dims ([B, T], as TorchRL's): a user collate
    # sees them and nothing is applied on top of it
    seen = []

    def collate(td):
        seen.append(td.batch_size)
        return td.set("tag", torch.ones(td.batch_size))

    data = BaseDatasetExperienceReplay(episodes_td(), batch_size=2, collate_fn=collate)
    sample = data.sample()
    assert seen == [torch.Size([2, 5])]
    assert sample.batch_size == (2, 5)
    assert sample["tag"].shape == (2, 5)


@pytest.mark.parametrize("bad, error", [
    (torch.zeros(3), TypeError),
    (TensorDict({"x": torch.zeros(())}, []), ValueError),
    (TensorDict({"x": torch.zeros(0)}, [0]), ValueError),
])
def test_bad_data(bad, error):
    with pytest.raises(error):
        BaseDatasetExperienceReplay(bad)


def test_delete_removes_both_paths(tmp_path):
    data = OnDisk(tmp_path, episodes_td(), batch_size=2)
    (tmp_path / "set" / "extra.json").write_text("{}")
    assert data.data_path.is_dir()
    data.delete()
    assert not (tmp_path / "set").exists()
    assert data.sample()["obs"].shape == (2, 5, 2)
    data.delete()  # nothing left: a no-op
