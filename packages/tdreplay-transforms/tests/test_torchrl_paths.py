"""TorchRL's submodules of ``torchrl.envs.transforms`` under ``tdreplay.transforms``."""

import importlib

import pytest

import tdreplay.transforms


@pytest.mark.parametrize("module", ["rb_transforms", "transforms", "vecnorm"])
def test_submodules_serve_the_package_objects(module):
    mod = importlib.import_module(f"tdreplay.transforms.{module}")
    names = getattr(mod, "__all__", None) or ["VecNorm"]
    assert names
    for name in names:
        assert getattr(mod, name) is getattr(tdreplay.transforms, name)


def test_rb_transforms_has_torchrls_three():
    from tdreplay.transforms.rb_transforms import (  # noqa: F401
        MultiStepTransform,
        NextStateReconstructor,
        PolicyAgeFilter,
    )


def test_the_legacy_hub_serves_every_transform_torchrl_has_there_and_tdreplay_too():
    from tdreplay.transforms import transforms as hub
    only_in_tdreplay = {"CallableTransform", "InvertedTransform", "MultiStep",
                        "MultiStepTransform", "NextStateReconstructor", "PolicyAgeFilter",
                        "PositiveDimError", "DimOutOfRangeError"}  # (errors of tdreplay's)
    assert set(hub.__all__) == set(tdreplay.transforms.__all__) - only_in_tdreplay
