"""The start-up hint core's wheel installs for ``import tdreplay.data`` without the meta."""

import doctest
import importlib.util
import sys
from pathlib import Path

import pytest

HINT = Path(__file__).resolve().parent.parent / "hints" / "_tdreplay_data_hint.py"


@pytest.fixture
def hint():
    spec = importlib.util.spec_from_file_location("_tdreplay_data_hint_under_test", HINT)
    module = importlib.util.module_from_spec(spec)
    before = list(sys.meta_path)
    spec.loader.exec_module(module)  # installs its finder
    yield module
    sys.meta_path[:] = before


def test_examples_run(hint):
    assert doctest.testmod(hint).failed == 0


def test_finder_is_last_and_installed_once(hint):
    hint.install()
    finders = [f for f in sys.meta_path if isinstance(f, hint.DataHintFinder)]
    assert len(finders) == 1 and sys.meta_path[-1] is finders[0]


def test_missing_facade_names_the_pip_line(hint, monkeypatch):
    # tests-core installs core alone (no meta-package): no other finder finds tdreplay.data
    monkeypatch.delitem(sys.modules, "tdreplay.data", raising=False)
    with pytest.raises(ModuleNotFoundError, match=r"pip install tdreplay") as info:
        importlib.import_module("tdreplay.data")
    assert info.value.name == "tdreplay.data"


def test_other_modules_are_not_its_business(hint):
    assert hint.DataHintFinder().find_spec("tdreplay.samplers", None) is None
    assert hint.DataHintFinder().find_spec("numpy", None) is None
