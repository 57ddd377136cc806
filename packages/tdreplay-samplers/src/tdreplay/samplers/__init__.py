"""tdreplay.samplers: samplers without replacement, prioritized and slice samplers."""

from tdreplay.core import RandomSampler, Sampler

from .without_replacement import SamplerWithoutReplacement

__version__ = "0.1.0"

__all__ = ["RandomSampler", "Sampler", "SamplerWithoutReplacement"]
