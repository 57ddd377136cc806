"""tdreplay.samplers: samplers without replacement, consuming, prioritized and slice samplers."""

from tdreplay.core import RandomSampler, Sampler

from ._slicing import SliceBatchError, SliceSizeError
from .consuming import ConsumingSampler
from .deferred_prioritized import DeferredPrioritizedSampler
from .prioritized import PrioritizedSampler
from .prioritized_buffers import PrioritizedReplayBuffer, TensorDictPrioritizedReplayBuffer
from .prioritized_slice import PrioritizedSliceSampler
from .prompt_group import PromptGroupSampler
from .scheduler import (
    LambdaScheduler,
    LinearScheduler,
    ParameterScheduler,
    SchedulerList,
    StepScheduler,
)
from .slice import SliceSampler, SliceSamplerWithoutReplacement
from .staleness import StalenessAwareSampler, StalenessWeightError
from .streaming_slice import StreamingSliceSampler
from .without_replacement import BatchLargerThanBufferError, SamplerWithoutReplacement

__version__ = "0.6.8"

__all__ = [
    "BatchLargerThanBufferError",
    "ConsumingSampler",
    "DeferredPrioritizedSampler",
    "LambdaScheduler",
    "LinearScheduler",
    "ParameterScheduler",
    "PrioritizedReplayBuffer",
    "PrioritizedSampler",
    "PrioritizedSliceSampler",
    "PromptGroupSampler",
    "RandomSampler",
    "Sampler",
    "SamplerWithoutReplacement",
    "SchedulerList",
    "SliceBatchError",
    "SliceSampler",
    "SliceSamplerWithoutReplacement",
    "SliceSizeError",
    "StalenessAwareSampler",
    "StalenessWeightError",
    "StepScheduler",
    "StreamingSliceSampler",
    "TensorDictPrioritizedReplayBuffer",
]
