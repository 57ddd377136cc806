"""tdreplay.datasets: offline datasets as read-only replay buffers.

:class:`MinariExperienceReplay` converts a `Minari <https://minari.farama.org>`_ dataset once
to memory-mapped files in TorchRL's TED layout and samples it like any replay buffer;
:class:`BaseDatasetExperienceReplay` is the read-only buffer it builds on (``data_path``,
``delete``, ``preprocess``). :func:`load_dataset` builds a dataset from a prefixed id
(``"minari:<id>"``), :func:`register_dataset` adds prefixes. For offline-to-online RL,
:class:`OfflineToOnlineReplayBuffer` samples a fixed share of each batch from a dataset and
the rest from an online buffer, and :func:`prefill_replay_buffer` copies a dataset into a
buffer.
"""

from .base import BaseDatasetExperienceReplay
from .minari_data import MinariExperienceReplay
from .offline_to_online import OfflineToOnlineReplayBuffer, prefill_replay_buffer
from .registry import load_dataset, register_dataset

__version__ = "0.6.6"

__all__ = [
    "BaseDatasetExperienceReplay",
    "MinariExperienceReplay",
    "OfflineToOnlineReplayBuffer",
    "load_dataset",
    "prefill_replay_buffer",
    "register_dataset",
]
