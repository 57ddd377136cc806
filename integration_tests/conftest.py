"""Fixtures shared by the integration tests."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

#: the benchmark scripts, which import each other as top-level modules
BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def benchmark_script() -> Iterator[Callable[[str], ModuleType]]:
    """``importlib.import_module`` with ``benchmarks/`` on ``sys.path`` for the test module."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield importlib.import_module
    finally:
        sys.path.remove(str(BENCHMARKS))
