"""TorchRL's module paths under tdreplay.data: every one resolves to the very objects of
tdreplay.data, lazily, and says what tdreplay lacks."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import tdreplay.data
from tdreplay.data import MissingComponentError
from tdreplay.data.torchrl_paths import TORCHRL_PATHS, served

DATA_DIR = Path(tdreplay.data.__file__).parent
#: every TorchRL path of which tdreplay has a name (tests-meta installs every component)
SERVED_PATHS = sorted(p for p, names in TORCHRL_PATHS.items()
                      if set(names) & set(tdreplay.data.__all__))


def _module_files() -> set[str]:
    """Dotted paths (below tdreplay.data) of the modules in the tdreplay/data folder."""
    out = set()
    for f in DATA_DIR.rglob("*.py"):
        parts = f.relative_to(DATA_DIR).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts and parts != ("torchrl_paths",):
            out.add(".".join(parts))
    return out


def test_a_module_exists_for_every_path_with_a_name_tdreplay_has_and_only_for_those():
    # parents of a served path are packages even when they serve nothing themselves
    parents = {".".join(p.split(".")[:i]) for p in SERVED_PATHS for i in range(1, p.count(".") + 1)}
    missing = sorted(set(SERVED_PATHS) - _module_files())
    assert missing == [], (
        f"tdreplay.data has names of TorchRL's torchrl.data.<path> for these paths but no module "
        f"tdreplay/data/<path>.py serving them (copy replay_buffers/samplers/base.py): {missing}")
    assert _module_files() <= set(SERVED_PATHS) | parents
    assert "replay_buffers.samplers" in SERVED_PATHS and "replay_buffers.utils" in TORCHRL_PATHS


@pytest.mark.parametrize("path", SERVED_PATHS)
def test_every_torchrl_name_tdreplay_has_resolves_to_the_same_object(path):
    module = importlib.import_module(f"tdreplay.data.{path}")
    names = served(module.__name__)
    assert names and module.__all__ == names
    assert names == sorted(set(TORCHRL_PATHS[path]) & set(tdreplay.data.__all__))
    for name in names:
        assert getattr(module, name) is getattr(tdreplay.data, name), name
        namespace: dict = {}
        exec(f"from tdreplay.data.{path} import {name}", namespace)
        assert namespace[name] is getattr(tdreplay.data, name)
    star: dict = {}
    exec(f"from tdreplay.data.{path} import *", star)
    assert {k for k in star if not k.startswith("__")} == set(names)
    assert set(names) <= set(dir(module))


def test_torchrl_tutorial_imports_migrate_with_the_one_line_change():
    from tdreplay.data.replay_buffers import ReplayBuffer, TensorDictReplayBuffer
    from tdreplay.data.replay_buffers.samplers import PrioritizedSampler, SliceSampler
    from tdreplay.data.replay_buffers.storages import LazyMemmapStorage, ListStorage
    from tdreplay.data.replay_buffers.writers import RoundRobinWriter
    from tdreplay.samplers import PrioritizedSampler as from_component

    assert PrioritizedSampler is from_component
    rb = ReplayBuffer(storage=ListStorage(10), sampler=PrioritizedSampler(10, 0.7, 0.5),
                      writer=RoundRobinWriter())
    assert rb.extend([1, 2, 3]).tolist() == [0, 1, 2]
    assert TensorDictReplayBuffer is tdreplay.data.TensorDictReplayBuffer
    assert LazyMemmapStorage is tdreplay.data.LazyMemmapStorage
    assert SliceSampler is tdreplay.data.SliceSampler


def test_names_torchrl_modules_import_are_served_there_too():
    # (TorchRL's query and checkpointers modules import these; its docs import them from
    # there, and from ... import failed here)
    from tdreplay.data.replay_buffers.checkpointers import H5Split, TED2Flat
    from tdreplay.data.replay_buffers.query import DEFAULT_DONE_KEYS, find_start_stop_traj, traj
    from tdreplay.data.replay_buffers.utils import DEFAULT_DONE_KEYS as from_utils

    assert traj is tdreplay.data.traj and TED2Flat is tdreplay.data.TED2Flat
    assert find_start_stop_traj is tdreplay.data.find_start_stop_traj
    assert H5Split is tdreplay.data.H5Split and DEFAULT_DONE_KEYS is from_utils


def test_submodules_are_attributes_as_in_torchrl():
    rb = tdreplay.data.replay_buffers
    assert rb.samplers.PrioritizedSampler is tdreplay.data.PrioritizedSampler
    assert rb.replay_buffers.tensordict.TensorDictReplayBuffer is tdreplay.data.TensorDictReplayBuffer
    assert rb.storages.tensor.LazyTensorStorage is tdreplay.data.LazyTensorStorage
    assert tdreplay.data.datasets.MinariExperienceReplay is tdreplay.data.MinariExperienceReplay


def test_offline_to_online_and_dataset_registry_are_served_where_torchrl_has_them():
    import tdreplay.datasets
    from tdreplay.data import OfflineToOnlineReplayBuffer, load_dataset, register_dataset
    from tdreplay.data.datasets import load_dataset as from_datasets
    from tdreplay.data.datasets import register_dataset as register_from_datasets
    from tdreplay.data.datasets.utils import load_dataset as from_utils
    from tdreplay.data.datasets.utils import register_dataset as register_from_utils
    from tdreplay.data.replay_buffers import OfflineToOnlineReplayBuffer as from_buffers
    from tdreplay.data.replay_buffers import prefill_replay_buffer as prefill_from_buffers
    from tdreplay.data.replay_buffers.offline_to_online import (
        OfflineToOnlineReplayBuffer as from_module,
    )
    from tdreplay.data.replay_buffers.offline_to_online import prefill_replay_buffer

    assert (OfflineToOnlineReplayBuffer is from_buffers is from_module
            is tdreplay.datasets.OfflineToOnlineReplayBuffer)
    assert prefill_replay_buffer is prefill_from_buffers is tdreplay.datasets.prefill_replay_buffer
    assert load_dataset is from_datasets is from_utils is tdreplay.datasets.load_dataset
    assert (register_dataset is register_from_datasets is register_from_utils
            is tdreplay.datasets.register_dataset)
    assert served("tdreplay.data.replay_buffers.offline_to_online") == [
        "OfflineToOnlineReplayBuffer", "prefill_replay_buffer"]
    assert served("tdreplay.data.datasets.utils") == ["load_dataset", "register_dataset"]
    assert tdreplay.data.replay_buffers.offline_to_online.prefill_replay_buffer is \
        prefill_replay_buffer
    # it works through the drop-in path: a plain buffer as the offline data
    rb = OfflineToOnlineReplayBuffer(
        tdreplay.data.ReplayBuffer(storage=tdreplay.data.ListStorage(4)),
        online_storage=tdreplay.data.ListStorage(4), offline_fraction=0.5)
    rb.offline_buffer.extend([1, 2, 3, 4])
    assert rb.extend([10, 11]).tolist() == [0, 1]
    assert [x >= 10 for x in rb.sample(4)] == [False, False, True, True]


def test_a_torchrl_name_tdreplay_lacks_says_so():
    with pytest.raises(ImportError, match="SumSegmentTreeFp32"):
        exec("from tdreplay.data.replay_buffers.samplers import SumSegmentTreeFp32", {})
    module = importlib.import_module("tdreplay.data.replay_buffers.samplers")
    with pytest.raises(AttributeError, match=r"tdreplay has no SumSegmentTreeFp32 \(TorchRL's "
                                             r"torchrl.data.replay_buffers.samplers"):
        module.SumSegmentTreeFp32  # noqa: B018
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchSampler'"):
        module.NoSuchSampler  # noqa: B018
    # a TorchRL submodule of which tdreplay has no name
    with pytest.raises(AttributeError, match="torchrl.data.replay_buffers.storages.utils"):
        tdreplay.data.replay_buffers.storages.utils  # noqa: B018
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("tdreplay.data.replay_buffers.storages.utils")


def test_a_name_of_a_missing_component_raises_missing_component_error(monkeypatch):
    module = importlib.import_module("tdreplay.data.replay_buffers.ray_buffer")
    monkeypatch.delitem(vars(module), "RayReplayBuffer", raising=False)
    monkeypatch.delitem(vars(tdreplay.data), "RayReplayBuffer", raising=False)
    for name in [n for n in sys.modules if n == "tdreplay.distributed"
                 or n.startswith("tdreplay.distributed.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "tdreplay.distributed", None)
    monkeypatch.setattr(tdreplay.data, "__all__",
                        [n for n in tdreplay.data.__all__ if n != "RayReplayBuffer"])
    with pytest.raises(MissingComponentError, match=r'pip install "tdreplay\[distributed\]"'):
        exec("from tdreplay.data.replay_buffers.ray_buffer import RayReplayBuffer", {})
    assert "RayReplayBuffer" not in served("tdreplay.data.replay_buffers")


LAZY = r"""
import sys
import tdreplay.data.replay_buffers
import {modules}
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("ray", "minari", "h5py")
                or (m.startswith("tdreplay.") and not m.startswith("tdreplay.data")))
assert loaded == [], loaded
from tdreplay.data.replay_buffers.samplers import PrioritizedSampler
from tdreplay.data.replay_buffers.ray_buffer import RayReplayBuffer
from tdreplay.data.datasets import MinariExperienceReplay
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("ray", "minari"))
assert heavy == [], heavy
print("lazy")
"""


def test_importing_the_paths_imports_no_component_and_neither_ray_nor_minari():
    modules = ", ".join(f"tdreplay.data.{p}" for p in SERVED_PATHS)
    out = subprocess.run([sys.executable, "-c", LAZY.format(modules=modules)],
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "lazy"
