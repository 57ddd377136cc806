"""TorchRL's ``torchrl.envs.transforms.transforms`` (its legacy hub of transforms): the names of
it that tdreplay has.

``from torchrl.envs.transforms.transforms import X`` migrates to
``from tdreplay.transforms.transforms import X``: the same objects as
:mod:`tdreplay.transforms` serves. The environment transforms of TorchRL's module are not in
tdreplay (it has no environments).

Examples
--------
>>> import tdreplay.transforms
>>> from tdreplay.transforms.transforms import CatFrames
>>> CatFrames is tdreplay.transforms.CatFrames
True
"""

from tdreplay.core import Compose, Transform

from .actions import DiscreteActionProjection, gSDENoise
from .burn_in import BurnInTransform
from .cat_frames import CatFrames
from .checks import FiniteTensorDictCheck, PinMemoryTransform
from .crop import RandomCropTensorDict
from .image import CenterCrop, GrayScale, Resize, ToTensorImage
from .keys import ExcludeTransform, RenameTransform, SelectTransform
from .normalization import ObservationNorm
from .reward import BinarizeReward, RewardClipping, RewardScaling
from .reward_to_go import Reward2GoTransform
from .tensors import (
    CatTensors,
    DeviceCastTransform,
    DoubleToFloat,
    DTypeCastTransform,
    FlattenObservation,
    SqueezeTransform,
    UnsqueezeTransform,
)
from .vecnorm import VecNorm

__all__ = [
    "BinarizeReward", "BurnInTransform", "CatFrames", "CatTensors", "CenterCrop", "Compose",
    "DTypeCastTransform", "DeviceCastTransform", "DiscreteActionProjection", "DoubleToFloat",
    "ExcludeTransform", "FiniteTensorDictCheck", "FlattenObservation", "GrayScale",
    "ObservationNorm", "PinMemoryTransform", "RandomCropTensorDict", "RenameTransform", "Resize",
    "Reward2GoTransform", "RewardClipping", "RewardScaling", "SelectTransform", "SqueezeTransform",
    "ToTensorImage", "Transform", "UnsqueezeTransform", "VecNorm", "gSDENoise",
]
