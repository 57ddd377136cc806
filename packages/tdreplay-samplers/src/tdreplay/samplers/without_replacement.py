"""``SamplerWithoutReplacement``: every written slot once per epoch.

It lives in :mod:`tdreplay.core` (``RandomSampler(replacement=False)`` returns one, as in
TorchRL, and core imports no sibling); this module serves the same objects under their
``tdreplay.samplers`` names.
"""

from __future__ import annotations

from tdreplay.core.sampler import (
    BatchLargerThanBufferError,
    SamplerWithoutReplacement,
    check_replacement,
)

__all__ = ["BatchLargerThanBufferError", "SamplerWithoutReplacement", "check_replacement"]
