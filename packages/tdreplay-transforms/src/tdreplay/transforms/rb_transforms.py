"""TorchRL's ``torchrl.envs.transforms.rb_transforms``: the replay-buffer transforms it holds.

``from torchrl.envs.transforms.rb_transforms import X`` migrates to
``from tdreplay.transforms.rb_transforms import X``: the same objects as
:mod:`tdreplay.transforms` serves.

Examples
--------
>>> import tdreplay.transforms
>>> from tdreplay.transforms.rb_transforms import NextStateReconstructor
>>> NextStateReconstructor is tdreplay.transforms.NextStateReconstructor
True
"""

from .multistep_transform import MultiStepTransform
from .next_state import NextStateReconstructor
from .policy_age import PolicyAgeFilter

__all__ = ["MultiStepTransform", "NextStateReconstructor", "PolicyAgeFilter"]
