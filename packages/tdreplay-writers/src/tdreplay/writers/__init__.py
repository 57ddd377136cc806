"""tdreplay.writers: writers for TensorDict replay buffers."""

from tdreplay.core import RoundRobinWriter, Writer

from .round_robin import TensorDictRoundRobinWriter

__version__ = "0.1.0"

__all__ = ["RoundRobinWriter", "TensorDictRoundRobinWriter", "Writer"]
