"""tdreplay.storages: tensor, lazy, stacked storages and their checkpointers."""

from tdreplay.core import ListStorage, ListStorageCheckpointer, Storage, StorageCheckpointerBase

from .lazy_stack_storage import LazyStackStorage
from .tensor_storage import LazyTensorStorage, TensorStorage, TensorStorageCheckpointer

__version__ = "0.1.0"

__all__ = [
    "LazyStackStorage",
    "LazyTensorStorage",
    "ListStorage",
    "ListStorageCheckpointer",
    "Storage",
    "StorageCheckpointerBase",
    "TensorStorage",
    "TensorStorageCheckpointer",
]
