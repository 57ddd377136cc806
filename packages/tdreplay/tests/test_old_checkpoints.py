"""Checkpoints written by an older tdreplay load into today's code and behave as the saved buffer.

Guards users' existing checkpoints: ``rb.dumps(path)`` directories and
``torch.save(rb.state_dict(), file)`` files written by commit 29fb400 (2026-11-23) for 13 small
buffer configurations (list / tensor / ndim=2 / memmap storages, compressed storages with zstd
and with zlib, a prioritized buffer on the numba trees after priority updates, samplers without
replacement and slice samplers mid-epoch, the max-value writer, a VecNorm transform with
statistics, an ensemble of two). The zstd one needs ``zstandard`` (the storages' ``zstd``
extra; skipped without it, as in the tests-meta session); the zlib one loads into a storage on
the default codec, whichever it is.
Each is loaded into a freshly built buffer of the same configuration, which must then show what
the old process observed right after saving: length, write count, contents, priorities, the next
seeded samples, one more write and the state after it. A state dropped on loading (sampler epoch,
priorities, writer cursor or heap, transform statistics) changes the samples or the write.

Fixtures: ``data/checkpoints_29fb400/<config>/`` (``dumps/``, ``state_dict.pt`` and the
observations in ``expected.json``), written by ``data/checkpoints_29fb400/make_fixtures.py`` run
with 29fb400's ``packages/*/src`` on ``PYTHONPATH`` (its docstring says how). The configurations
and the observation are that script's (imported here), so both sides build and observe the same
way. A ``dumps`` directory is copied to ``tmp_path`` before loading: loading must not need to
write into the repository. Never regenerate these fixtures with today's code: they stand for
checkpoints that already exist.
"""

from __future__ import annotations

import importlib.util
import json
import math
import pickle
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

FIXTURES = Path(__file__).parent / "data" / "checkpoints_29fb400"


def _load_script() -> Any:
    name = "tdreplay_old_checkpoint_fixtures"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, FIXTURES / "make_fixtures.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


fixtures = _load_script()
CONFIGS = sorted(p.name for p in FIXTURES.iterdir() if (p / "expected.json").is_file())


def test_every_configuration_has_fixtures() -> None:
    assert CONFIGS == sorted(fixtures.CONFIGS)
    for name in CONFIGS:
        assert (FIXTURES / name / "dumps").is_dir(), name
        assert (FIXTURES / name / "state_dict.pt").is_file(), name


def _mismatches(expected: Any, got: Any, path: str = "", out: list[str] | None = None) -> list[str]:
    """Differences between a recorded observation and today's (floats to 1e-6 relative).

    Tensors must have the same dtype, shape and values; a sampled or read TensorDict must hold
    every recorded entry (entries added since are not a checkpoint's business).
    """
    out = [] if out is None else out
    if isinstance(expected, dict) and "__tensor__" in expected:
        if not (isinstance(got, dict) and "__tensor__" in got):
            out.append(f"{path}: a tensor was recorded, got {str(got)[:200]}")
        elif (expected["dtype"], expected["shape"]) != (got["dtype"], got["shape"]):
            out.append(f"{path}: recorded {expected['dtype']} {expected['shape']}, "
                       f"got {got['dtype']} {got['shape']}")
        else:
            want = torch.tensor(expected["__tensor__"], dtype=torch.float64)
            have = torch.tensor(got["__tensor__"], dtype=torch.float64)
            exact = not any(t in expected["dtype"] for t in ("float", "bfloat"))
            if not torch.allclose(want, have, rtol=0 if exact else 1e-6,
                                  atol=0 if exact else 1e-7, equal_nan=True):
                out.append(f"{path}: recorded {expected['__tensor__']}, got {got['__tensor__']}")
        return out
    if isinstance(expected, dict) and "__td__" in expected:
        if not (isinstance(got, dict) and "__td__" in got):
            out.append(f"{path}: a TensorDict was recorded, got {str(got)[:200]}")
            return out
        _mismatches(expected["batch_size"], got["batch_size"], f"{path}.batch_size", out)
        missing = sorted(set(expected["__td__"]) - set(got["__td__"]))
        if missing:
            out.append(f"{path}: entries {missing} missing")
        for key in sorted(set(expected["__td__"]) & set(got["__td__"])):
            _mismatches(expected["__td__"][key], got["__td__"][key], f"{path}[{key!r}]", out)
        return out
    if isinstance(expected, dict):
        if not isinstance(got, dict) or set(expected) != set(got):
            out.append(f"{path}: recorded keys {sorted(expected)}, got {str(got)[:200]}")
            return out
        for key in sorted(expected):
            _mismatches(expected[key], got[key], f"{path}.{key}", out)
        return out
    if isinstance(expected, list):
        if not isinstance(got, list) or len(expected) != len(got):
            out.append(f"{path}: recorded {str(expected)[:200]}, got {str(got)[:200]}")
            return out
        for i, (e, g) in enumerate(zip(expected, got)):
            _mismatches(e, g, f"{path}[{i}]", out)
        return out
    if isinstance(expected, float) and isinstance(got, (int, float)):
        if not math.isclose(expected, got, rel_tol=1e-6, abs_tol=1e-9):
            out.append(f"{path}: recorded {expected!r}, got {got!r}")
        return out
    if type(expected) is not type(got) or expected != got:
        out.append(f"{path}: recorded {expected!r}, got {got!r}")
    return out


# state_dict files that torch.load(weights_only=True) refuses: a CompressedListStorage's state
# holds its rows as tdreplay objects (CompressedRow); today's state_dict does so too.
FULL_UNPICKLE = {"compressed_list_storage", "compressed_list_storage_zlib"}


def _load(way: str, name: str, rb: Any, tmp_path: Path) -> None:
    if way == "dumps":
        copy = tmp_path / "checkpoint"
        shutil.copytree(FIXTURES / name / "dumps", copy)
        rb.loads(copy)
    else:
        file = FIXTURES / name / "state_dict.pt"
        try:
            state = torch.load(file, weights_only=True)
        except pickle.UnpicklingError:
            if name not in FULL_UNPICKLE:
                raise
            state = torch.load(file, weights_only=False)
        rb.load_state_dict(state)


@pytest.mark.parametrize("way", ["dumps", "state_dict"])
@pytest.mark.parametrize("name", CONFIGS)
def test_old_checkpoint_loads_and_behaves_as_saved(name: str, way: str, tmp_path: Path) -> None:
    recorded = json.loads((FIXTURES / name / "expected.json").read_text())
    cfg = fixtures.CONFIGS[name]
    for module in cfg.needs:  # a zstd checkpoint: zstandard is the storages' zstd extra
        pytest.importorskip(module)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    rb = cfg.build(str(scratch))
    if "backend" in recorded:  # the fixture's trees were numba's: same backend today
        assert rb.sampler.backend == recorded["backend"]
    _load(way, name, rb, tmp_path)
    if "codec" in recorded:  # the storage goes on with the codec of the rows it loaded
        assert rb.storage.codec.name == recorded["codec"]
    observed = json.loads(json.dumps(fixtures.observe(cfg, rb)))
    problems = _mismatches(recorded["observed"], observed)
    assert not problems, f"{name} ({way}) differs from the buffer that was saved:\n" + "\n".join(
        problems[:12]
    )
