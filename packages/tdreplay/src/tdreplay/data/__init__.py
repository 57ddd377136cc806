"""tdreplay.data: the public API of every tdreplay component in one module.

Migrating from TorchRL is a change of import: ``from torchrl.data import ...`` becomes
``from tdreplay.data import ...``. The transforms (``torchrl.envs`` in TorchRL) and the trainer
hooks (``torchrl.trainers``) are here too.

Names are resolved on first use (PEP 562), so ``import tdreplay.data`` stays cheap and Ray or
Minari are imported only when their classes are used.

TorchRL's submodule paths are here too, serving the same objects:
``from tdreplay.data.replay_buffers.samplers import PrioritizedSampler`` is
``tdreplay.data.PrioritizedSampler`` (see :mod:`tdreplay.data.torchrl_paths`).

``pip install tdreplay`` installs every component except the two with heavy third-party
backends, which are extras: ``pip install "tdreplay[datasets]"`` (Minari, h5py),
``pip install "tdreplay[distributed]"`` (Ray), ``pip install "tdreplay[all]"`` (both).
``tdreplay.data`` serves the names of the components that are installed (``__all__`` lists
those); a name of a component that is not installed (or cannot be imported) raises
:class:`MissingComponentError`, an :class:`ImportError` naming the distribution and the
``pip install`` line.

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
import importlib.util
import sys
from typing import Any

__version__ = "0.6.11"

#: public name -> the component module that defines it
_EXPORTS: dict[str, str] = {
    # tdreplay.core
    "BatchLargerThanBufferError": "tdreplay.core",
    "CallableTransform": "tdreplay.core",
    "CheckpointError": "tdreplay.core",
    "Compose": "tdreplay.core",
    "ConditionalUpdateResult": "tdreplay.core",
    "ConsumingSampler": "tdreplay.core",
    "DEFAULT_DONE_KEYS": "tdreplay.core",
    "FORMAT_VERSION": "tdreplay.core",
    "HERReplayBuffer": "tdreplay.core",
    "HindsightStrategy": "tdreplay.core",
    "InvertedTransform": "tdreplay.core",
    "ListStorage": "tdreplay.core",
    "ListStorageCheckpointer": "tdreplay.core",
    "MinSize": "tdreplay.core",
    "NotShareableError": "tdreplay.core",
    "RateLimitTimeout": "tdreplay.core",
    "RateLimiter": "tdreplay.core",
    "SampleToInsertRatio": "tdreplay.core",
    "RandomSampler": "tdreplay.core",
    "ReplayBuffer": "tdreplay.core",
    "RevisionTracking": "tdreplay.core",
    "RoundRobinWriter": "tdreplay.core",
    "Sampler": "tdreplay.core",
    "SampleUnit": "tdreplay.core",
    "SamplerWithoutReplacement": "tdreplay.core",
    "Sequence": "tdreplay.core",
    "StateDictCheckpointer": "tdreplay.core",
    "Storage": "tdreplay.core",
    "StorageCheckpointerBase": "tdreplay.core",
    "StorageIndexError": "tdreplay.core",
    "TensorDictReplayBuffer": "tdreplay.core",
    "Trajectory": "tdreplay.core",
    "TrajectoryPredicate": "tdreplay.core",
    "Transform": "tdreplay.core",
    "Transition": "tdreplay.core",
    "Writer": "tdreplay.core",
    "filter_trajectories": "tdreplay.core",
    "find_start_stop_traj": "tdreplay.core",
    "identity_collate": "tdreplay.core",
    "iter_trajectories": "tdreplay.core",
    "register_service_backend": "tdreplay.core",
    "service_backend": "tdreplay.core",
    "split_trajectories": "tdreplay.core",
    "stack_items": "tdreplay.core",
    "traj": "tdreplay.core",
    "transport_backend": "tdreplay.core",
    # tdreplay.storages
    "CompressedListStorage": "tdreplay.storages",
    "CompressedListStorageCheckpointer": "tdreplay.storages",
    "Flat2TED": "tdreplay.storages",
    "FlatStorageCheckpointer": "tdreplay.storages",
    "H5Combine": "tdreplay.storages",
    "H5Split": "tdreplay.storages",
    "H5StorageCheckpointer": "tdreplay.storages",
    "LazyMemmapStorage": "tdreplay.storages",
    "LazyStackStorage": "tdreplay.storages",
    "LazyTensorStorage": "tdreplay.storages",
    "SharedLazyTensorStorage": "tdreplay.storages",
    "StoreStorage": "tdreplay.storages",
    "StoreStorageCheckpointer": "tdreplay.storages",
    "Nested2TED": "tdreplay.storages",
    "NestedStorageCheckpointer": "tdreplay.storages",
    "TED2Flat": "tdreplay.storages",
    "TED2Nested": "tdreplay.storages",
    "TensorStorage": "tdreplay.storages",
    "TensorStorageCheckpointer": "tdreplay.storages",
    # tdreplay.samplers
    "DeferredPrioritizedSampler": "tdreplay.samplers",
    "LambdaScheduler": "tdreplay.samplers",
    "LinearScheduler": "tdreplay.samplers",
    "ParameterScheduler": "tdreplay.samplers",
    "PrioritizedReplayBuffer": "tdreplay.samplers",
    "PrioritizedSampler": "tdreplay.samplers",
    "PrioritizedSliceSampler": "tdreplay.samplers",
    "PromptGroupSampler": "tdreplay.samplers",
    "SchedulerList": "tdreplay.samplers",
    "SliceBatchError": "tdreplay.samplers",
    "SliceSampler": "tdreplay.samplers",
    "SliceSamplerWithoutReplacement": "tdreplay.samplers",
    "SliceSizeError": "tdreplay.samplers",
    "StalenessAwareSampler": "tdreplay.samplers",
    "StalenessWeightError": "tdreplay.samplers",
    "StepScheduler": "tdreplay.samplers",
    "StreamingSliceSampler": "tdreplay.samplers",
    "TensorDictPrioritizedReplayBuffer": "tdreplay.samplers",
    # tdreplay.writers
    "ImmutableDatasetWriter": "tdreplay.writers",
    "NotATensorCollectionError": "tdreplay.writers",
    "TensorDictMaxValueWriter": "tdreplay.writers",
    "TensorDictRoundRobinWriter": "tdreplay.writers",
    # tdreplay.transforms
    "BinarizeReward": "tdreplay.transforms",
    "BurnInTransform": "tdreplay.transforms",
    "CatFrames": "tdreplay.transforms",
    "CatTensors": "tdreplay.transforms",
    "CenterCrop": "tdreplay.transforms",
    "DTypeCastTransform": "tdreplay.transforms",
    "DeviceCastTransform": "tdreplay.transforms",
    "DimOutOfRangeError": "tdreplay.transforms",
    "DiscreteActionProjection": "tdreplay.transforms",
    "DoubleToFloat": "tdreplay.transforms",
    "ExcludeTransform": "tdreplay.transforms",
    "FiniteTensorDictCheck": "tdreplay.transforms",
    "FlattenObservation": "tdreplay.transforms",
    "GrayScale": "tdreplay.transforms",
    "MultiStep": "tdreplay.transforms",
    "MultiStepTransform": "tdreplay.transforms",
    "NextStateReconstructor": "tdreplay.transforms",
    "ObservationNorm": "tdreplay.transforms",
    "PinMemoryTransform": "tdreplay.transforms",
    "PolicyAgeFilter": "tdreplay.transforms",
    "PositiveDimError": "tdreplay.transforms",
    "RandomCropTensorDict": "tdreplay.transforms",
    "RenameTransform": "tdreplay.transforms",
    "Resize": "tdreplay.transforms",
    "Reward2GoTransform": "tdreplay.transforms",
    "RewardClipping": "tdreplay.transforms",
    "RewardScaling": "tdreplay.transforms",
    "SelectTransform": "tdreplay.transforms",
    "SqueezeTransform": "tdreplay.transforms",
    "ToTensorImage": "tdreplay.transforms",
    "UnsqueezeTransform": "tdreplay.transforms",
    "VecNorm": "tdreplay.transforms",
    "gSDENoise": "tdreplay.transforms",
    # tdreplay.ensembles
    "ReplayBufferEnsemble": "tdreplay.ensembles",
    "SampleFromAllConflictError": "tdreplay.ensembles",
    "SamplerEnsemble": "tdreplay.ensembles",
    "StorageEnsemble": "tdreplay.ensembles",
    "StorageEnsembleCheckpointer": "tdreplay.ensembles",
    "WriterEnsemble": "tdreplay.ensembles",
    "stack_parts": "tdreplay.ensembles",
    # tdreplay.datasets
    "BaseDatasetExperienceReplay": "tdreplay.datasets",
    "MinariExperienceReplay": "tdreplay.datasets",
    "OfflineToOnlineReplayBuffer": "tdreplay.datasets",
    "load_dataset": "tdreplay.datasets",
    "prefill_replay_buffer": "tdreplay.datasets",
    "register_dataset": "tdreplay.datasets",
    # tdreplay.trainers
    "HOOK_DESTINATIONS": "tdreplay.trainers",
    "OptimizerHook": "tdreplay.trainers",
    "ReplayBufferTrainer": "tdreplay.trainers",
    "Trainer": "tdreplay.trainers",
    "TrainerHookBase": "tdreplay.trainers",
    # tdreplay.distributed
    "BufferActorDiedError": "tdreplay.distributed",
    "BufferNotFoundError": "tdreplay.distributed",
    "BufferStartError": "tdreplay.distributed",
    "BufferStateLostError": "tdreplay.distributed",
    "DistributedBufferClient": "tdreplay.distributed",
    "ShardsUnavailableWarning": "tdreplay.distributed",
    "RayReplayBuffer": "tdreplay.distributed",
    "RemoteBufferError": "tdreplay.distributed",
    "RemoteCallTimeoutError": "tdreplay.distributed",
    "RemoteTensorDictReplayBuffer": "tdreplay.distributed",
    "ShardedReplayBuffer": "tdreplay.distributed",
}

#: component module -> (its distribution, the extra of ``tdreplay`` that installs it or None)
_COMPONENTS: dict[str, tuple[str, str | None]] = {
    "tdreplay.core": ("tdreplay-core", None),
    "tdreplay.storages": ("tdreplay-storages", None),
    "tdreplay.samplers": ("tdreplay-samplers", None),
    "tdreplay.writers": ("tdreplay-writers", None),
    "tdreplay.transforms": ("tdreplay-transforms", None),
    "tdreplay.ensembles": ("tdreplay-ensembles", None),
    "tdreplay.trainers": ("tdreplay-trainers", None),
    "tdreplay.datasets": ("tdreplay-datasets", "datasets"),
    "tdreplay.distributed": ("tdreplay-distributed", "distributed"),
}


class MissingComponentError(ImportError):
    """A name of :mod:`tdreplay.data` whose component is not installed or cannot be imported.

    The message names the distribution and the ``pip install`` line that installs it (through
    the meta-package's extra where there is one). A subclass of :class:`ImportError`, so
    ``except ImportError`` catches it.

    Attributes
    ----------
    distribution : str
        The component's distribution, e.g. ``"tdreplay-distributed"``.
    install : str
        The command that installs it, e.g. ``'pip install "tdreplay[distributed]"'``.

    Examples
    --------
    >>> err = MissingComponentError("RayReplayBuffer", "tdreplay.distributed")
    >>> err.distribution, err.install
    ('tdreplay-distributed', 'pip install "tdreplay[distributed]"')
    >>> print(err)  # doctest: +ELLIPSIS
    tdreplay.data.RayReplayBuffer needs tdreplay-distributed, which is not installed. Install ...
    >>> isinstance(err, ImportError)
    True
    """

    def __init__(self, name: str, module: str, missing: str | None = None) -> None:
        self.distribution, extra = _COMPONENTS[module]
        pinned = _pinned(self.distribution)
        alone = f"pip install {pinned}"
        self.install = f'pip install "tdreplay[{extra}]"' if extra else alone
        if missing is None or missing == module or module.startswith(missing + "."):
            what = f"{self.distribution}, which is not installed"
        else:  # the component is there, one of its own dependencies is not
            what = (f"{self.distribution}, which cannot be imported: its dependency "
                    f"{missing!r} is not installed")
        how = self.install if not extra else f"{self.install} (or: {alone})"
        super().__init__(f"tdreplay.data.{name} needs {what}. Install it with: {how}",
                         name=module)


def _pinned(distribution: str) -> str:
    """``distribution==<version>`` as the installed meta-package pins it, else the bare name."""
    from importlib import metadata

    try:
        requires = metadata.requires("tdreplay") or []
    except metadata.PackageNotFoundError:  # tdreplay.data run from a source tree
        return distribution
    for raw in requires:
        req = raw.split(";")[0].replace(" ", "")
        if req.startswith(distribution + "=="):
            return req
    return distribution


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


#: the public names of the installed components (what ``from tdreplay.data import *`` gives)
__all__ = sorted(name for name, module in _EXPORTS.items() if _installed(module))


#: submodules: TorchRL's module paths (``tdreplay.data.replay_buffers.samplers``, ...)
_SUBMODULES = frozenset({"datasets", "replay_buffers", "torchrl_paths"})


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        if name in _SUBMODULES and __name__ == "tdreplay.data":
            return importlib.import_module(f"{__name__}.{name}")
        raise AttributeError(f"module 'tdreplay.data' has no attribute {name!r}", name=name,
                             obj=sys.modules.get(__name__))
    try:
        component = importlib.import_module(module)
    except ModuleNotFoundError as err:
        raise MissingComponentError(name, module, missing=err.name) from err
    value = getattr(component, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
