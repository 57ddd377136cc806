"""TorchRL's module paths under ``torchrl.data``, served by :mod:`tdreplay.data`.

``from torchrl.data.replay_buffers.samplers import PrioritizedSampler`` migrates like
``from torchrl.data import PrioritizedSampler``: change ``torchrl.data`` to ``tdreplay.data``.
Each module ``tdreplay.data.<path>`` below serves the names of TorchRL's
``torchrl.data.<path>`` that tdreplay has, as the very objects of :mod:`tdreplay.data`,
resolved on first use (importing ``tdreplay.data.replay_buffers`` imports no component, and
neither Ray nor Minari until their classes are used). A module exists for every path of which
tdreplay has at least one name; a name of TorchRL's module that tdreplay does not have raises
an ``AttributeError`` (``ImportError`` from ``from ... import``) that says so, and a name of a
component that is not installed the :class:`~tdreplay.data.MissingComponentError` of
:mod:`tdreplay.data`.

Examples
--------
>>> import tdreplay.data
>>> from tdreplay.data.replay_buffers.samplers import PrioritizedSampler
>>> PrioritizedSampler is tdreplay.data.PrioritizedSampler
True
>>> from tdreplay.data.replay_buffers.storages.tensor import LazyMemmapStorage
>>> LazyMemmapStorage is tdreplay.data.LazyMemmapStorage
True
>>> served("tdreplay.data.replay_buffers.writers.round_robin")
['RoundRobinWriter', 'TensorDictRoundRobinWriter']
>>> torchrl_module("tdreplay.data.replay_buffers.samplers")
'torchrl.data.replay_buffers.samplers'
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import tdreplay.data as _data

__all__ = ["TORCHRL_PATHS", "lazy_dir", "lazy_getattr", "served", "torchrl_module"]

#: path under ``torchrl.data`` (and ``tdreplay.data``) -> the public names of TorchRL's module
#: there (its ``__all__``, or the classes and functions it defines, and the public names it
#: imports that TorchRL's docs import from it), TorchRL at commit
#: ae9719f17b1517af5c2523a36c4616f003ee55cf (0.14), and ``StreamingSliceSampler`` (0.14.1).
#: Paths without any name tdreplay has are
#: listed so that a name tdreplay gains is found where TorchRL has it (see :func:`served`).
TORCHRL_PATHS: dict[str, tuple[str, ...]] = {
    "datasets": (
        "AtariDQNExperienceReplay", "BaseDatasetExperienceReplay", "D4RLExperienceReplay",
        "GenDGRLExperienceReplay", "lerobot_columns_to_tensordict", "LeRobotExperienceReplay",
        "load_dataset", "MinariExperienceReplay", "OpenMLExperienceReplay", "OpenXExperienceReplay",
        "register_dataset", "RobosetExperienceReplay", "VD4RLExperienceReplay",
    ),
    "datasets.common": ("BaseDatasetExperienceReplay",),
    "datasets.minari_data": ("MinariExperienceReplay",),
    "datasets.utils": ("load_dataset", "register_dataset"),
    "replay_buffers": (
        "CompressedListStorage", "CompressedListStorageCheckpointer", "ConditionalUpdateResult",
        "ConsumingSampler", "DEFAULT_DONE_KEYS", "filter_trajectories", "find_start_stop_traj",
        "Flat2TED", "FlatStorageCheckpointer", "H5Combine", "H5Split", "H5StorageCheckpointer",
        "HERReplayBuffer", "HindsightStrategy", "ImmutableDatasetWriter", "iter_trajectories",
        "LazyMemmapStorage", "LazyStackStorage", "LazyTensorStorage", "ListStorage",
        "ListStorageCheckpointer", "Nested2TED", "NestedStorageCheckpointer",
        "OfflineToOnlineReplayBuffer", "prefill_replay_buffer", "PrioritizedReplayBuffer",
        "PrioritizedSampler", "PrioritizedSliceSampler", "PromptGroupSampler", "RandomSampler",
        "RayReplayBuffer", "RemoteTensorDictReplayBuffer", "ReplayBuffer", "ReplayBufferEnsemble",
        "RoundRobinWriter", "Sampler", "SamplerEnsemble", "SamplerWithoutReplacement", "SampleUnit",
        "Sequence", "SliceSampler", "SliceSamplerWithoutReplacement", "StalenessAwareSampler",
        "Storage", "StorageCheckpointerBase", "StorageEnsemble", "StorageEnsembleCheckpointer",
        "StoreStorage", "StreamingSliceSampler", "TED2Flat", "TED2Nested",
        "TensorDictMaxValueWriter", "TensorDictPrioritizedReplayBuffer", "TensorDictReplayBuffer",
        "TensorDictRoundRobinWriter", "TensorStorage", "TensorStorageCheckpointer", "traj",
        "Trajectory", "TrajectoryPredicate", "Transition", "Writer", "WriterEnsemble",
    ),
    # (+ the TED hooks it imports, which TorchRL's docs import from there)
    "replay_buffers.checkpointers": (
        "CompressedListStorageCheckpointer", "Flat2TED", "FlatStorageCheckpointer", "H5Combine",
        "H5Split", "H5StorageCheckpointer", "ListStorageCheckpointer", "Nested2TED",
        "NestedStorageCheckpointer", "StorageCheckpointerBase", "StorageEnsembleCheckpointer",
        "TED2Flat", "TED2Nested", "TensorStorageCheckpointer",
    ),
    "replay_buffers.her": ("HERReplayBuffer", "HindsightStrategy"),
    "replay_buffers.offline_to_online": ("OfflineToOnlineReplayBuffer", "prefill_replay_buffer"),
    # (+ traj, find_start_stop_traj and DEFAULT_DONE_KEYS, which it imports)
    "replay_buffers.query": (
        "DEFAULT_DONE_KEYS", "filter_trajectories", "find_start_stop_traj", "iter_trajectories",
        "traj", "Trajectory", "TrajectoryPredicate",
    ),
    "replay_buffers.ray_buffer": ("as_remote", "RayReplayBuffer"),
    "replay_buffers.replay_buffers": (
        "ConditionalUpdateResult", "InPlaceSampler", "PrioritizedReplayBuffer",
        "RemoteTensorDictReplayBuffer", "ReplayBuffer", "ReplayBufferEnsemble", "stack_tensors",
        "TensorDictPrioritizedReplayBuffer", "TensorDictReplayBuffer",
    ),
    "replay_buffers.replay_buffers.base": ("ConditionalUpdateResult", "ReplayBuffer"),
    "replay_buffers.replay_buffers.deprecated": ("InPlaceSampler", "stack_tensors"),
    "replay_buffers.replay_buffers.ensemble": ("ReplayBufferEnsemble",),
    "replay_buffers.replay_buffers.prioritized": ("PrioritizedReplayBuffer",),
    "replay_buffers.replay_buffers.prioritized_tensordict": ("TensorDictPrioritizedReplayBuffer",),
    "replay_buffers.replay_buffers.remote": ("RemoteTensorDictReplayBuffer",),
    "replay_buffers.replay_buffers.tensordict": ("TensorDictReplayBuffer",),
    "replay_buffers.sample_units": ("SampleUnit", "Sequence", "Transition"),
    "replay_buffers.samplers": (
        "ConsumingSampler", "CudaMinSegmentTreeFp32", "CudaMinSegmentTreeFp64",
        "CudaSumSegmentTreeFp32", "CudaSumSegmentTreeFp64", "MinSegmentTreeFp32",
        "MinSegmentTreeFp64", "PrioritizedSampler", "PrioritizedSliceSampler", "PromptGroupSampler",
        "RandomSampler", "Sampler", "SamplerEnsemble", "SamplerWithoutReplacement", "SliceSampler",
        "SliceSamplerWithoutReplacement", "StalenessAwareSampler", "StreamingSliceSampler",
        "SumSegmentTreeFp32", "SumSegmentTreeFp64",
    ),
    "replay_buffers.samplers.base": ("Sampler",),
    "replay_buffers.samplers.ensemble": ("SamplerEnsemble",),
    "replay_buffers.samplers.llm": ("PromptGroupSampler",),
    "replay_buffers.samplers.prioritized": ("PrioritizedSampler",),
    "replay_buffers.samplers.prioritized_slice": ("PrioritizedSliceSampler",),
    "replay_buffers.samplers.random": (
        "ConsumingSampler", "RandomSampler", "SamplerWithoutReplacement",
    ),
    "replay_buffers.samplers.slice": ("SliceSampler",),
    "replay_buffers.samplers.slice_without_replacement": ("SliceSamplerWithoutReplacement",),
    "replay_buffers.samplers.staleness": ("StalenessAwareSampler",),
    "replay_buffers.samplers.streaming_slice": ("StreamingSliceSampler",),
    "replay_buffers.scheduler": (
        "LambdaScheduler", "LinearScheduler", "ParameterScheduler", "SchedulerList",
        "StepScheduler",
    ),
    "replay_buffers.storages": (
        "CompressedListStorage", "LazyMemmapStorage", "LazyStackStorage", "LazyTensorStorage",
        "ListStorage", "Storage", "StorageEnsemble", "StoreStorage", "TensorStorage",
    ),
    "replay_buffers.storages.base": ("Storage",),
    "replay_buffers.storages.ensemble": ("StorageEnsemble",),
    "replay_buffers.storages.list": ("CompressedListStorage", "LazyStackStorage", "ListStorage"),
    "replay_buffers.storages.store": ("StoreStorage",),
    "replay_buffers.storages.tensor": ("LazyMemmapStorage", "LazyTensorStorage", "TensorStorage"),
    "replay_buffers.storages.utils": (),
    "replay_buffers.utils": (
        "DEFAULT_DONE_KEYS", "find_start_stop_traj", "Flat2TED", "H5Combine", "H5Split",
        "INT_CLASSES_TYPING", "Nested2TED", "pin_memory_output", "SINGLE_TENSOR_BUFFER_NAME",
        "TED2Flat", "TED2Nested", "tree_iter", "unravel_index",
    ),
    "replay_buffers.writers": (
        "ImmutableDatasetWriter", "RoundRobinWriter", "TensorDictMaxValueWriter",
        "TensorDictRoundRobinWriter", "Writer", "WriterEnsemble",
    ),
    "replay_buffers.writers.base": ("ImmutableDatasetWriter", "Writer"),
    "replay_buffers.writers.ensemble": ("WriterEnsemble",),
    "replay_buffers.writers.max_value": ("TensorDictMaxValueWriter",),
    "replay_buffers.writers.round_robin": ("RoundRobinWriter", "TensorDictRoundRobinWriter"),
}

_PREFIX = "tdreplay.data."


def _path(module: str) -> str:
    if not module.startswith(_PREFIX) or module[len(_PREFIX):] not in TORCHRL_PATHS:
        raise ValueError(f"{module!r} is not a TorchRL path served by tdreplay.data.")
    return module[len(_PREFIX):]


def torchrl_module(module: str) -> str:
    """TorchRL's module that ``module`` (``"tdreplay.data.<path>"``) stands for.

    Examples
    --------
    >>> torchrl_module("tdreplay.data.datasets")
    'torchrl.data.datasets'
    """
    return "torchrl.data." + _path(module)


def _children(module: str) -> list[str]:
    """The submodule names of ``module`` in TorchRL (``samplers``, ``storages``, ...)."""
    path = _path(module) + "."
    return sorted({p[len(path):].split(".")[0] for p in TORCHRL_PATHS if p.startswith(path)})


def served(module: str) -> list[str]:
    """The names ``module`` serves: TorchRL's names there that installed tdreplay has.

    Sorted; what ``from tdreplay.data.<path> import *`` takes.

    Examples
    --------
    >>> served("tdreplay.data.replay_buffers.storages.tensor")
    ['LazyMemmapStorage', 'LazyTensorStorage', 'TensorStorage']
    """
    have = set(_data.__all__)
    return sorted(name for name in TORCHRL_PATHS[_path(module)] if name in have)


def lazy_getattr(module: str, name: str) -> Any:
    """The module-level ``__getattr__`` of ``module``: TorchRL's ``name`` from tdreplay.data.

    A submodule of TorchRL's module is imported; the object is cached in ``module``'s globals.

    Raises
    ------
    AttributeError
        ``name`` is not a name of TorchRL's module, or tdreplay does not have it.
    MissingComponentError
        The component that has ``name`` is not installed (an ``ImportError``).

    Examples
    --------
    >>> lazy_getattr("tdreplay.data.replay_buffers", "samplers").__name__
    'tdreplay.data.replay_buffers.samplers'
    >>> lazy_getattr("tdreplay.data.replay_buffers", "NoSuchName")
    Traceback (most recent call last):
    ...
    AttributeError: module 'tdreplay.data.replay_buffers' has no attribute 'NoSuchName'
    """
    path = _path(module)
    if name in _children(module):
        try:
            value = importlib.import_module(f"{module}.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"{module}.{name}":
                raise
            raise AttributeError(
                f"tdreplay has none of the names of TorchRL's torchrl.data.{path}.{name} "
                "(see the migration guide)", name=name, obj=sys.modules[module]) from None
        return value
    if name not in TORCHRL_PATHS[path]:
        raise AttributeError(f"module {module!r} has no attribute {name!r}", name=name,
                             obj=sys.modules[module])
    try:
        value = getattr(_data, name)
    except AttributeError as err:
        if err.obj is not _data or err.name != name:
            raise
        raise AttributeError(
            f"tdreplay has no {name} (TorchRL's torchrl.data.{path}.{name}); see the "
            "migration guide for what tdreplay does not have", name=name,
            obj=sys.modules[module]) from None
    setattr(sys.modules[module], name, value)
    return value


def lazy_dir(module: str) -> list[str]:
    """The module-level ``__dir__`` of ``module``: its globals, served names and submodules."""
    return sorted(set(vars(sys.modules[module])) | set(served(module)))
