"""tdreplay.data: the public API of every tdreplay component in one module.

Migrating from TorchRL is a change of import: ``from torchrl.data import ...`` becomes
``from tdreplay.data import ...``.

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

from tdreplay.core import (
    FORMAT_VERSION,
    CallableTransform,
    CheckpointError,
    Compose,
    InvertedTransform,
    ListStorage,
    ListStorageCheckpointer,
    RandomSampler,
    ReplayBuffer,
    RoundRobinWriter,
    Sampler,
    Storage,
    StorageCheckpointerBase,
    TensorDictReplayBuffer,
    Transform,
    Writer,
)
from tdreplay.datasets import BaseDatasetExperienceReplay, MinariExperienceReplay
from tdreplay.ensembles import (
    ReplayBufferEnsemble,
    SamplerEnsemble,
    StorageEnsemble,
    StorageEnsembleCheckpointer,
    WriterEnsemble,
)
from tdreplay.samplers import SamplerWithoutReplacement
from tdreplay.storages import (
    LazyStackStorage,
    LazyTensorStorage,
    TensorStorage,
    TensorStorageCheckpointer,
)
from tdreplay.writers import TensorDictRoundRobinWriter

__version__ = "0.1.0"

__all__ = [
    "FORMAT_VERSION",
    "BaseDatasetExperienceReplay",
    "CallableTransform",
    "CheckpointError",
    "Compose",
    "InvertedTransform",
    "LazyStackStorage",
    "LazyTensorStorage",
    "ListStorage",
    "ListStorageCheckpointer",
    "MinariExperienceReplay",
    "RandomSampler",
    "ReplayBuffer",
    "ReplayBufferEnsemble",
    "RoundRobinWriter",
    "Sampler",
    "SamplerEnsemble",
    "SamplerWithoutReplacement",
    "Storage",
    "StorageCheckpointerBase",
    "StorageEnsemble",
    "StorageEnsembleCheckpointer",
    "TensorDictReplayBuffer",
    "TensorDictRoundRobinWriter",
    "TensorStorage",
    "TensorStorageCheckpointer",
    "Transform",
    "Writer",
    "WriterEnsemble",
]
