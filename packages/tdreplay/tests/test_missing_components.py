"""tdreplay.data with a component missing: the other names work, a missing one says what to
install (the distribution and the ``pip install`` line), and ``__all__`` lists what is there."""

from __future__ import annotations

import importlib
import importlib.util
import sys

import pytest

import tdreplay.data
from tdreplay.data import MissingComponentError

DATA_PY = tdreplay.data.__file__


def hide(monkeypatch, module: str) -> None:
    """Make ``import <module>`` fail as it does when its distribution is not installed."""
    for name in [n for n in sys.modules if n == module or n.startswith(module + ".")]:
        monkeypatch.delitem(sys.modules, name)
    # None in sys.modules: the import system raises ModuleNotFoundError(name=module)
    monkeypatch.setitem(sys.modules, module, None)
    for name, home in tdreplay.data._EXPORTS.items():
        if home == module:  # forget names already resolved (cached in the module's globals)
            monkeypatch.delitem(tdreplay.data.__dict__, name, raising=False)


def fresh_facade(monkeypatch):
    """Execute data.py again as a new module (its import-time ``__all__`` computed anew)."""
    spec = importlib.util.spec_from_file_location("tdreplay_data_fresh", DATA_PY)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("name", "module", "dist", "extra"), [
    ("RayReplayBuffer", "tdreplay.distributed", "tdreplay-distributed", "distributed"),
    ("ShardedReplayBuffer", "tdreplay.distributed", "tdreplay-distributed", "distributed"),
    ("MinariExperienceReplay", "tdreplay.datasets", "tdreplay-datasets", "datasets"),
])
def test_name_of_a_missing_optional_component_says_what_to_install(monkeypatch, name, module,
                                                                    dist, extra):
    hide(monkeypatch, module)
    with pytest.raises(ImportError) as info:
        exec(f"from tdreplay.data import {name}", {})
    err = info.value
    assert isinstance(err, MissingComponentError)
    message = str(err)
    assert f"tdreplay.data.{name} needs {dist}, which is not installed" in message
    assert f'pip install "tdreplay[{extra}]"' in message
    # the component alone, at the version the installed meta-package pins
    version = importlib.metadata.version(dist)
    assert f"pip install {dist}=={version}" in message
    assert err.distribution == dist and err.install == f'pip install "tdreplay[{extra}]"'
    assert err.name == module
    assert isinstance(err.__cause__, ModuleNotFoundError)
    # attribute access says the same
    with pytest.raises(MissingComponentError, match=dist):
        getattr(tdreplay.data, name)


def test_missing_required_component_names_the_component_not_an_extra(monkeypatch):
    """The meta-package is installed but a component it requires was removed."""
    hide(monkeypatch, "tdreplay.samplers")
    version = importlib.metadata.version("tdreplay-samplers")
    with pytest.raises(MissingComponentError) as info:
        tdreplay.data.PrioritizedSampler  # noqa: B018
    assert str(info.value) == (
        "tdreplay.data.PrioritizedSampler needs tdreplay-samplers, which is not installed. "
        f"Install it with: pip install tdreplay-samplers=={version}")
    assert "tdreplay[" not in str(info.value)


def test_missing_dependency_of_an_installed_component(monkeypatch):
    """tdreplay-distributed is there but importing it fails on its own dependency."""
    hide(monkeypatch, "tdreplay.distributed")
    monkeypatch.delitem(sys.modules, "tdreplay.distributed")

    def import_module(name, package=None):
        raise ModuleNotFoundError("No module named 'ray'", name="ray")

    monkeypatch.setattr(tdreplay.data.importlib, "import_module", import_module)
    with pytest.raises(MissingComponentError) as info:
        tdreplay.data.RayReplayBuffer  # noqa: B018
    message = str(info.value)
    assert "tdreplay-distributed, which cannot be imported: its dependency 'ray' is not " \
           "installed" in message
    assert 'pip install "tdreplay[distributed]"' in message


def test_other_errors_are_not_masked(monkeypatch):
    """Only a missing module becomes MissingComponentError; a bug in a component stays itself."""
    hide(monkeypatch, "tdreplay.distributed")
    monkeypatch.delitem(sys.modules, "tdreplay.distributed")

    def import_module(name, package=None):
        raise RuntimeError("boom")

    monkeypatch.setattr(tdreplay.data.importlib, "import_module", import_module)
    with pytest.raises(RuntimeError, match="boom"):
        tdreplay.data.RayReplayBuffer  # noqa: B018


def test_core_names_work_and_all_lists_installed_components_only(monkeypatch):
    hide(monkeypatch, "tdreplay.distributed")
    hide(monkeypatch, "tdreplay.datasets")
    facade = fresh_facade(monkeypatch)
    assert "RayReplayBuffer" not in facade.__all__
    assert "MinariExperienceReplay" not in facade.__all__
    assert "RayReplayBuffer" not in dir(facade)
    assert {"ReplayBuffer", "LazyTensorStorage", "PrioritizedSampler", "Trainer",
            "ReplayBufferEnsemble", "MultiStep", "TensorDictMaxValueWriter"} <= set(facade.__all__)
    from tdreplay.core import ReplayBuffer

    assert facade.ReplayBuffer is ReplayBuffer
    # a star import takes what is installed and does not fail on what is not
    namespace: dict = {}
    exec("from tdreplay_data_fresh import *", namespace)
    assert "LazyTensorStorage" in namespace and "RayReplayBuffer" not in namespace
    with pytest.raises(facade.MissingComponentError,
                       match=r'pip install "tdreplay\[distributed\]"'):
        facade.RayReplayBuffer  # noqa: B018


def test_every_installed_component_is_in_all():
    # tests-meta installs every extra: every name is served
    assert tdreplay.data.__all__ == sorted(tdreplay.data._EXPORTS)


def test_every_component_has_a_distribution_and_extras_match_the_meta_package():
    """_COMPONENTS agrees with packages/tdreplay/pyproject.toml: the optional components are
    exactly those of the extras, the others are plain dependencies."""
    from importlib import metadata

    from packaging.requirements import Requirement

    assert set(tdreplay.data._EXPORTS.values()) == set(tdreplay.data._COMPONENTS)
    requires = [Requirement(r) for r in metadata.requires("tdreplay")]
    for dist, extra in tdreplay.data._COMPONENTS.values():
        pins = [r for r in requires if r.name == dist]
        assert pins, f"tdreplay does not require {dist}"
        plain = [r for r in pins if r.marker is None]
        if extra is None:
            assert plain, (dist, pins)
        else:
            assert not plain, f"{dist} is optional but a plain dependency of tdreplay"
            assert any(r.marker.evaluate({"extra": extra}) for r in pins), (dist, pins)
            assert any(r.marker.evaluate({"extra": "all"}) for r in pins), (dist, pins)
