"""tdreplay.data: the public API of every tdreplay component in one module.

Migrating from TorchRL is a change of import: ``from torchrl.data import ...`` becomes
``from tdreplay.data import ...``. The transforms (``torchrl.envs`` in TorchRL) and the trainer
hooks (``torchrl.trainers``) are here too.

Names are resolved on first use (PEP 562), so ``import tdreplay.data`` stays cheap and Ray or
Minari are imported only when their classes are used.

Examples
--------
>>> import torch
>>> from tensordict import TensorDict
>>> from tdreplay.data import LazyTensorStorage, TensorDictReplayBuffer
>>> rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), batch_size=8)
>>> _ = rb.extend(TensorDict({"obs": torch.randn(10, 4)}, [10]))
>>> rb.sample()["obs"].shape
torch.Size([8, 4])
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

#: public name -> the component module that defines it
_EXPORTS: dict[str, str] = {
    # tdreplay.core
    "CallableTransform": "tdreplay.core",
    "CheckpointError": "tdreplay.core",
    "Compose": "tdreplay.core",
    "FORMAT_VERSION": "tdreplay.core",
    "InvertedTransform": "tdreplay.core",
    "ListStorage": "tdreplay.core",
    "ListStorageCheckpointer": "tdreplay.core",
    "RandomSampler": "tdreplay.core",
    "ReplayBuffer": "tdreplay.core",
    "RoundRobinWriter": "tdreplay.core",
    "Sampler": "tdreplay.core",
    "Storage": "tdreplay.core",
    "StorageCheckpointerBase": "tdreplay.core",
    "TensorDictReplayBuffer": "tdreplay.core",
    "Transform": "tdreplay.core",
    "Writer": "tdreplay.core",
    "identity_collate": "tdreplay.core",
    "split_trajectories": "tdreplay.core",
    "stack_items": "tdreplay.core",
    # tdreplay.storages
    "CompressedListStorage": "tdreplay.storages",
    "CompressedListStorageCheckpointer": "tdreplay.storages",
    "FlatStorageCheckpointer": "tdreplay.storages",
    "H5StorageCheckpointer": "tdreplay.storages",
    "LazyMemmapStorage": "tdreplay.storages",
    "LazyStackStorage": "tdreplay.storages",
    "LazyTensorStorage": "tdreplay.storages",
    "NestedStorageCheckpointer": "tdreplay.storages",
    "TensorStorage": "tdreplay.storages",
    "TensorStorageCheckpointer": "tdreplay.storages",
    # tdreplay.samplers
    "PrioritizedReplayBuffer": "tdreplay.samplers",
    "PrioritizedSampler": "tdreplay.samplers",
    "PrioritizedSliceSampler": "tdreplay.samplers",
    "SamplerWithoutReplacement": "tdreplay.samplers",
    "SliceSampler": "tdreplay.samplers",
    "SliceSamplerWithoutReplacement": "tdreplay.samplers",
    "TensorDictPrioritizedReplayBuffer": "tdreplay.samplers",
    # tdreplay.writers
    "ImmutableDatasetWriter": "tdreplay.writers",
    "TensorDictMaxValueWriter": "tdreplay.writers",
    "TensorDictRoundRobinWriter": "tdreplay.writers",
    # tdreplay.transforms
    "CatFrames": "tdreplay.transforms",
    "CatTensors": "tdreplay.transforms",
    "CenterCrop": "tdreplay.transforms",
    "DTypeCastTransform": "tdreplay.transforms",
    "DeviceCastTransform": "tdreplay.transforms",
    "ExcludeTransform": "tdreplay.transforms",
    "GrayScale": "tdreplay.transforms",
    "MultiStep": "tdreplay.transforms",
    "RenameTransform": "tdreplay.transforms",
    "Resize": "tdreplay.transforms",
    "SelectTransform": "tdreplay.transforms",
    "ToTensorImage": "tdreplay.transforms",
    "UnsqueezeTransform": "tdreplay.transforms",
    # tdreplay.ensembles
    "ReplayBufferEnsemble": "tdreplay.ensembles",
    "SamplerEnsemble": "tdreplay.ensembles",
    "StorageEnsemble": "tdreplay.ensembles",
    "StorageEnsembleCheckpointer": "tdreplay.ensembles",
    "WriterEnsemble": "tdreplay.ensembles",
    "stack_parts": "tdreplay.ensembles",
    # tdreplay.datasets
    "BaseDatasetExperienceReplay": "tdreplay.datasets",
    "MinariExperienceReplay": "tdreplay.datasets",
    # tdreplay.trainers
    "HOOK_DESTINATIONS": "tdreplay.trainers",
    "OptimizerHook": "tdreplay.trainers",
    "ReplayBufferTrainer": "tdreplay.trainers",
    "Trainer": "tdreplay.trainers",
    "TrainerHookBase": "tdreplay.trainers",
    # tdreplay.distributed
    "BufferActorDiedError": "tdreplay.distributed",
    "RayReplayBuffer": "tdreplay.distributed",
    "RemoteBufferError": "tdreplay.distributed",
    "RemoteCallTimeoutError": "tdreplay.distributed",
    "ShardedReplayBuffer": "tdreplay.distributed",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tdreplay.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
