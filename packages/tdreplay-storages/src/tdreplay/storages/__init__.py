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
from .store_storage import StoreStorage, StoreStorageCheckpointer
from .ted_hooks import Flat2TED, TED2Flat
from .ted_nested import H5Combine, H5Split, Nested2TED, TED2Nested
from .tensor_storage import LazyTensorStorage, TensorStorage

__version__ = "0.6.9"

__all__ = [
    "CompressedListStorage",
    "CompressedListStorageCheckpointer",
    "Flat2TED",
    "FlatStorageCheckpointer",
    "H5Combine",
    "H5Split",
    "H5StorageCheckpointer",
    "LazyMemmapStorage",
    "LazyStackStorage",
    "LazyTensorStorage",
    "ListStorage",
    "ListStorageCheckpointer",
    "Nested2TED",
    "NestedStorageCheckpointer",
    "SharedLazyTensorStorage",
    "Storage",
    "StorageCheckpointerBase",
    "StoreStorage",
    "StoreStorageCheckpointer",
    "TED2Flat",
    "TED2Nested",
    "TensorStorage",
    "TensorStorageCheckpointer",
]
