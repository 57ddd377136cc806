"""tdreplay.datasets: offline datasets as read-only replay buffers.

:class:`MinariExperienceReplay` converts a `Minari <https://minari.farama.org>`_ dataset once
to memory-mapped files in TorchRL's TED layout and samples it like any replay buffer;
:class:`BaseDatasetExperienceReplay` is the read-only buffer it builds on (``data_path``,
``delete``, ``preprocess``).
"""

from .base import BaseDatasetExperienceReplay
from .minari_data import MinariExperienceReplay

__version__ = "0.2.0"

__all__ = ["BaseDatasetExperienceReplay", "MinariExperienceReplay"]
