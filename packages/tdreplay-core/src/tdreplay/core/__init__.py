"""tdreplay.core: the replay-buffer engine.

Interfaces (:class:`Storage`, :class:`Sampler`, :class:`Writer`, :class:`Transform`), the
buffers (:class:`ReplayBuffer`, :class:`TensorDictReplayBuffer`) and the defaults a bare buffer
needs (:class:`ListStorage`, :class:`RandomSampler`, :class:`RoundRobinWriter`), and
:class:`SamplerWithoutReplacement` (what ``RandomSampler(replacement=False)`` returns, as in
TorchRL), and :class:`ConsumingSampler` (what ``consume_after_n_samples=`` builds).
"""

from .buffer_conditional import ConditionalUpdateResult
from .checkpoint import FORMAT_VERSION, CheckpointError
from .collate import identity_collate, stack_items
from .consuming import ConsumingSampler
from .her import HERReplayBuffer
from .hindsight import HindsightStrategy
from .process_sharing import NotShareableError
from .query import Trajectory, TrajectoryPredicate, filter_trajectories, iter_trajectories, traj
from .rate_limit import MinSize, RateLimiter, RateLimitTimeout, SampleToInsertRatio
from .replay_buffer import ReplayBuffer, TensorDictReplayBuffer
from .revision import RevisionTracking
from .sample_units import SampleUnit, Sequence, Transition
from .sampler import BatchLargerThanBufferError, RandomSampler, Sampler, SamplerWithoutReplacement
from .service_backends import register_service_backend, service_backend, transport_backend
from .state_dict_checkpointer import StateDictCheckpointer
from .storage import (
    ListStorage,
    ListStorageCheckpointer,
    Storage,
    StorageCheckpointerBase,
    StorageIndexError,
)
from .trajectories import split_trajectories
from .trajectory_bounds import DEFAULT_DONE_KEYS, find_start_stop_traj
from .transform import CallableTransform, Compose, InvertedTransform, Transform
from .writer import RoundRobinWriter, Writer

__version__ = "0.6.11"

__all__ = [
    "DEFAULT_DONE_KEYS",
    "FORMAT_VERSION",
    "BatchLargerThanBufferError",
    "CallableTransform",
    "CheckpointError",
    "Compose",
    "ConditionalUpdateResult",
    "ConsumingSampler",
    "HERReplayBuffer",
    "HindsightStrategy",
    "InvertedTransform",
    "ListStorage",
    "ListStorageCheckpointer",
    "MinSize",
    "NotShareableError",
    "RandomSampler",
    "RateLimitTimeout",
    "RateLimiter",
    "ReplayBuffer",
    "RevisionTracking",
    "RoundRobinWriter",
    "SampleToInsertRatio",
    "SampleUnit",
    "Sampler",
    "SamplerWithoutReplacement",
    "Sequence",
    "StateDictCheckpointer",
    "Storage",
    "StorageCheckpointerBase",
    "StorageIndexError",
    "TensorDictReplayBuffer",
    "Trajectory",
    "TrajectoryPredicate",
    "Transform",
    "Transition",
    "Writer",
    "filter_trajectories",
    "find_start_stop_traj",
    "identity_collate",
    "iter_trajectories",
    "register_service_backend",
    "service_backend",
    "split_trajectories",
    "stack_items",
    "traj",
    "transport_backend",
]
