"""tdreplay.transforms: transforms applied by tdreplay buffers on sample (and, inverted, on extend).

Every transform builds on :class:`tdreplay.core.Transform`; :class:`Compose` (from
``tdreplay.core``) chains them, and plain callables are accepted wherever a transform is.
The slice samplers of ``CatFrames.make_rb_transform_and_sampler`` live in
:mod:`tdreplay.transforms.frame_sampler` (imported on use: it imports ``tdreplay.samplers``).
"""

from tdreplay.core import CallableTransform, Compose, InvertedTransform, Transform

from .actions import DiscreteActionProjection, gSDENoise
from .burn_in import BurnInTransform
from .cat_frames import CatFrames
from .checks import FiniteTensorDictCheck, PinMemoryTransform
from .crop import RandomCropTensorDict
from .image import CenterCrop, GrayScale, Resize, ToTensorImage
from .keys import ExcludeTransform, RenameTransform, SelectTransform
from .multistep import MultiStep
from .multistep_transform import MultiStepTransform
from .next_state import NextStateReconstructor
from .normalization import ObservationNorm
from .policy_age import PolicyAgeFilter
from .reward import BinarizeReward, RewardClipping, RewardScaling
from .reward_to_go import Reward2GoTransform
from .tensors import (
    CatTensors,
    DeviceCastTransform,
    DimOutOfRangeError,
    DoubleToFloat,
    DTypeCastTransform,
    FlattenObservation,
    PositiveDimError,
    SqueezeTransform,
    UnsqueezeTransform,
)
from .vecnorm import VecNorm

__version__ = "0.6.7"

__all__ = [
    "BinarizeReward",
    "BurnInTransform",
    "CallableTransform",
    "CatFrames",
    "CatTensors",
    "CenterCrop",
    "Compose",
    "DTypeCastTransform",
    "DeviceCastTransform",
    "DimOutOfRangeError",
    "DiscreteActionProjection",
    "DoubleToFloat",
    "ExcludeTransform",
    "FiniteTensorDictCheck",
    "FlattenObservation",
    "GrayScale",
    "InvertedTransform",
    "MultiStep",
    "MultiStepTransform",
    "NextStateReconstructor",
    "ObservationNorm",
    "PinMemoryTransform",
    "PolicyAgeFilter",
    "PositiveDimError",
    "RandomCropTensorDict",
    "RenameTransform",
    "Resize",
    "Reward2GoTransform",
    "RewardClipping",
    "RewardScaling",
    "SelectTransform",
    "SqueezeTransform",
    "ToTensorImage",
    "Transform",
    "UnsqueezeTransform",
    "VecNorm",
    "gSDENoise",
]
