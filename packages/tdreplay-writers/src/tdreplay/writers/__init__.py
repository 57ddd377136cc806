"""tdreplay.writers: writers for TensorDict replay buffers."""

from tdreplay.core import RoundRobinWriter, Writer

from .immutable import ImmutableDatasetWriter
from .max_value import NotATensorCollectionError, TensorDictMaxValueWriter
from .round_robin import TensorDictRoundRobinWriter

__version__ = "0.6.5"

__all__ = [
    "ImmutableDatasetWriter",
    "NotATensorCollectionError",
    "RoundRobinWriter",
    "TensorDictMaxValueWriter",
    "TensorDictRoundRobinWriter",
    "Writer",
]
