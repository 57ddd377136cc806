"""tdreplay.ensembles: sample from several replay buffers at once.

:class:`ReplayBufferEnsemble` composes a :class:`StorageEnsemble`, a :class:`SamplerEnsemble`
and a :class:`WriterEnsemble`; each batch is drawn in parts from several buffers, each part
collated and transformed by its own buffer, then joined (:func:`stack_parts`) and transformed
by the ensemble.
"""

from .collate import stack_parts
from .replay_buffer import ReplayBufferEnsemble
from .sampler import SampleFromAllConflictError, SamplerEnsemble
from .storage import StorageEnsemble, StorageEnsembleCheckpointer
from .writer import WriterEnsemble

__version__ = "0.6.8"

__all__ = [
    "ReplayBufferEnsemble",
    "SampleFromAllConflictError",
    "SamplerEnsemble",
    "StorageEnsemble",
    "StorageEnsembleCheckpointer",
    "WriterEnsemble",
    "stack_parts",
]
