"""tdreplay.storages: tensor, memory-mapped, stacked and compressed storages, and checkpointers."""

from tdreplay.core import ListStorage, ListStorageCheckpointer, Storage, StorageCheckpointerBase

from .checkpointers import (
    CompressedListStorageCheckpointer,
    FlatStorageCheckpointer,
    H5StorageCheckpointer,
    NestedStorageCheckpointer,
    TensorStorageCheckpointer,
)
from .compressed_storage import CompressedListStorage
from .lazy_stack_storage import LazyStackStorage
from .memmap_storage import LazyMemmapStorage
from .shared_tensor_storage import SharedLazyTensorStorage
from .ted_hooks import Flat2TED, TED2Flat
from .tensor_storage import LazyTensorStorage, TensorStorage

__version__ = "0.2.0"

__all__ = [
    "CompressedListStorage",
    "CompressedListStorageCheckpointer",
    "Flat2TED",
    "FlatStorageCheckpointer",
    "H5StorageCheckpointer",
    "LazyMemmapStorage",
    "LazyStackStorage",
    "LazyTensorStorage",
    "ListStorage",
    "ListStorageCheckpointer",
    "NestedStorageCheckpointer",
    "SharedLazyTensorStorage",
    "Storage",
    "StorageCheckpointerBase",
    "TED2Flat",
    "TensorStorage",
    "TensorStorageCheckpointer",
]
