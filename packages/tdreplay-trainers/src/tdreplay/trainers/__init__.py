"""tdreplay.trainers: a hook-based training loop and the replay-buffer hook.

:class:`Trainer` runs a collection loop and an optimisation loop and calls the ops registered at
named places (:data:`HOOK_DESTINATIONS`); :class:`ReplayBufferTrainer` writes collected batches
into a replay buffer, samples optimisation batches and updates priorities from the loss.
"""

from .hooks import OptimizerHook, TrainerHookBase
from .replay_buffer import ReplayBufferTrainer
from .trainer import HOOK_DESTINATIONS, Trainer

__version__ = "0.6.4"

__all__ = [
    "HOOK_DESTINATIONS",
    "OptimizerHook",
    "ReplayBufferTrainer",
    "Trainer",
    "TrainerHookBase",
]
