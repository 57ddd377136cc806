"""TorchRL's TED hooks TED2Nested, Nested2TED, H5Split, H5Combine are served where TorchRL has
them: ``tdreplay.data``, ``tdreplay.data.replay_buffers`` and ``...replay_buffers.utils``."""

import importlib

import pytest

import tdreplay.data
import tdreplay.storages

NAMES = ("TED2Nested", "Nested2TED", "H5Split", "H5Combine")


@pytest.mark.parametrize("name", NAMES)
def test_served_at_torchrl_paths(name):
    cls = getattr(tdreplay.storages, name)
    assert name in tdreplay.storages.__all__ and name in tdreplay.data.__all__
    assert getattr(tdreplay.data, name) is cls
    for path in ("tdreplay.data.replay_buffers", "tdreplay.data.replay_buffers.utils"):
        module = importlib.import_module(path)
        assert name in module.__all__
        namespace: dict = {}
        exec(f"from {path} import {name}", namespace)
        assert namespace[name] is cls, path


def test_subclasses_as_torchrl():
    assert issubclass(tdreplay.data.TED2Nested, tdreplay.data.TED2Flat)
    assert issubclass(tdreplay.data.Nested2TED, tdreplay.data.Flat2TED)
    assert issubclass(tdreplay.data.H5Split, tdreplay.data.TED2Flat)
