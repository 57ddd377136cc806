"""Boolean arguments of the datasets take a bool (or a numpy bool) and nothing else: ``"yes"``,
``1``, ``"False"`` (truthy in TorchRL) or ``None`` raise a ``TypeError`` naming the argument
before anything is converted or written. ``download`` keeps its own values (a bool or
``"force"``)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import testing
from tdreplay.datasets import BaseDatasetExperienceReplay, MinariExperienceReplay
from tdreplay.datasets.registry import register_dataset

BAD = testing.NOT_BOOLS
GOOD = testing.BOOLS


def dataset(**kwargs) -> BaseDatasetExperienceReplay:
    return BaseDatasetExperienceReplay(TensorDict({"x": torch.arange(6)}, [6]), batch_size=2,
                                       **kwargs)


def double(td):
    return td.set("x", td["x"] * 2)


@pytest.mark.parametrize("value", BAD)
def test_base_pin_memory_refuses_what_is_not_a_bool(value):
    with pytest.raises(TypeError, match="pin_memory must be a bool, got"):
        dataset(pin_memory=value)


@pytest.mark.parametrize("value", GOOD)
def test_base_pin_memory_takes_bools_and_numpy_bools(value):
    assert len(dataset(pin_memory=value).sample()) == 2


@pytest.mark.parametrize("value", BAD)
def test_preprocess_refuses_a_pbar_that_is_not_a_bool(tmp_path, value):
    data = dataset()
    with pytest.raises(TypeError, match="pbar must be a bool, got"):
        data.preprocess(double, num_workers=0, pbar=value, dest=tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert data[:]["x"].tolist() == list(range(6))


@pytest.mark.parametrize("value", GOOD)
def test_preprocess_takes_bools_and_numpy_bools(tmp_path, value):
    storage = dataset().preprocess(double, num_workers=0, pbar=value, dest=tmp_path / "out")
    assert storage[:]["x"].tolist() == [0, 2, 4, 6, 8, 10]


@pytest.mark.parametrize("value", BAD)
def test_register_dataset_refuses_a_replace_that_is_not_a_bool(value):
    with pytest.raises(TypeError, match="replace must be a bool, got"):
        register_dataset("flag-test", "fractions:Fraction", replace=value)


@pytest.mark.parametrize("name", ["split_trajs", "load_from_local_minari", "pin_memory"])
@pytest.mark.parametrize("value", BAD)
def test_minari_refuses_a_flag_that_is_not_a_bool_before_converting(cartpole, root, name, value):
    kwargs = {"load_from_local_minari": True, name: value}
    with pytest.raises(TypeError, match=f"{name} must be a bool, got"):
        MinariExperienceReplay(cartpole, 4, root=root, **kwargs)
    assert not root.exists() or not any(root.iterdir())  # nothing converted


@pytest.mark.parametrize("value", [np.bool_(True), np.bool_(False)])
def test_minari_takes_numpy_bools(cartpole, root, value):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        data = MinariExperienceReplay(cartpole, 4, root=root, load_from_local_minari=True,
                                      split_trajs=value, pin_memory=value)
    assert data.split_trajs is bool(value) and data.load_from_local_minari is True
    assert data.data_path.name.endswith("_split") is bool(value)


@pytest.mark.parametrize("value", ["yes", 1, None, "True"])
def test_minari_download_keeps_its_values(cartpole, root, value):
    with pytest.raises(ValueError, match="download must be True, False or 'force'"):
        MinariExperienceReplay(cartpole, 4, root=root, download=value,
                               load_from_local_minari=True)
