"""tdreplay.transforms: transforms applied by tdreplay buffers on sample (and, inverted, on extend).

Every transform builds on :class:`tdreplay.core.Transform`; :class:`Compose` (from
``tdreplay.core``) chains them, and plain callables are accepted wherever a transform is.
"""

from tdreplay.core import CallableTransform, Compose, InvertedTransform, Transform

from .cat_frames import CatFrames
from .image import CenterCrop, GrayScale, Resize, ToTensorImage
from .keys import ExcludeTransform, RenameTransform, SelectTransform
from .multistep import MultiStep
from .tensors import CatTensors, DeviceCastTransform, DTypeCastTransform, UnsqueezeTransform

__version__ = "0.1.0"

__all__ = [
    "CallableTransform",
    "CatFrames",
    "CatTensors",
    "CenterCrop",
    "Compose",
    "DTypeCastTransform",
    "DeviceCastTransform",
    "ExcludeTransform",
    "GrayScale",
    "InvertedTransform",
    "MultiStep",
    "RenameTransform",
    "Resize",
    "SelectTransform",
    "ToTensorImage",
    "Transform",
    "UnsqueezeTransform",
]
