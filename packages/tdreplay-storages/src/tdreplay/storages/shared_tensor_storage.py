"""``LazyTensorStorage(shared_init=True)``: a lazy tensor storage any of several processes lays out.

A plain :class:`~tdreplay.storages.LazyTensorStorage` keeps its tensors, its row count and its
writer's counters in the memory of one process: a buffer over it cannot be shared (see
:mod:`tdreplay.core.buffer_sharing`). With ``shared_init=True`` (as TorchRL) it builds a
:class:`SharedLazyTensorStorage` instead: the same storage, whose tensors are memory-mapped files
in a temporary directory and whose counters and lock live there too (the machinery of
:class:`~tdreplay.storages.LazyMemmapStorage`). The first write of whichever process comes first
lays it out; every process that holds the storage (forked, or spawned with it) then reads and
writes the same rows.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from tensordict import TensorDictBase

from tdreplay.core import StorageCheckpointerBase
from tdreplay.core.utils import check_flag

from ._tensorclasses import NestedClasses
from .memmap_storage import LazyMemmapStorage
from .tensor_storage import LazyTensorStorage


class SharedLazyTensorStorage(LazyMemmapStorage):
    """What ``LazyTensorStorage(max_size, shared_init=True)`` builds (an instance of
    :class:`LazyTensorStorage` and of :class:`LazyMemmapStorage`).

    Parameters are those of :class:`LazyTensorStorage`. The data lives on the CPU (memory-mapped
    files in a temporary directory, ``scratch_dir``, removed when the creating process drops the
    storage, unless ``cleanup_memmap=False``): a ``device`` other than the CPU cannot be
    honoured, which the first write says in a warning. ``compilable=True`` is refused (as
    TorchRL); ``consolidated=True`` has no effect (warned about).

    Examples
    --------
    >>> import multiprocessing as mp
    >>> from tensordict import TensorDict
    >>> from tdreplay.core import ReplayBuffer
    >>> def collect(rb, worker):
    ...     rb.extend(TensorDict({"x": torch.full((2,), float(worker))}, [2]))
    >>> storage = LazyTensorStorage(100, shared_init=True)
    >>> rb = ReplayBuffer(storage=storage, batch_size=4, shared=True)
    >>> workers = [mp.get_context("fork").Process(target=collect, args=(rb, i)) for i in (1, 2)]
    >>> for w in workers: w.start()
    >>> for w in workers: w.join()
    >>> len(rb), sorted(rb[:]["x"].tolist())
    (4, [1.0, 1.0, 2.0, 2.0])
    >>> isinstance(storage, LazyTensorStorage), storage.shared_init
    (True, True)
    """

    #: always True (what ``shared_init=True`` asked for)
    shared_init = True
    non_tensor_refusal = ("LazyTensorStorage(shared_init=True) shares its rows with other "
                          "processes through memory-mapped files, and non-tensor values held "
                          "in one process would diverge from theirs silently")

    def __init__(
        self,
        max_size: int,
        *,
        device: str | torch.device = "cpu",
        ndim: int = 1,
        checkpointer: StorageCheckpointerBase | None = None,
        compilable: bool = False,
        consolidated: bool = False,
        shared_init: bool = True,
        cleanup_memmap: bool = True,
    ) -> None:
        consolidated = check_flag(consolidated, "consolidated")
        cleanup_memmap = check_flag(cleanup_memmap, "cleanup_memmap")
        check_flag(shared_init, "shared_init")
        if check_flag(compilable, "compilable"):
            raise RuntimeError("Cannot share a compilable storage between processes.")
        if not shared_init:
            raise ValueError("SharedLazyTensorStorage is what LazyTensorStorage(shared_init=True) "
                             "builds: use LazyTensorStorage for shared_init=False.")
        requested = None if device in (None, "auto") else torch.device(device)
        #: the device asked for, when the memory-mapped CPU files cannot honour it (warned
        #: about once, by the first write)
        self._unhonoured_device = requested if requested and requested.type != "cpu" else None
        if consolidated:
            warnings.warn("LazyTensorStorage(shared_init=True) keeps one memory-mapped file per "
                          "entry, shared with other processes: consolidated=True has no effect "
                          "(as in TorchRL).", UserWarning, stacklevel=3)
        # cleanup_memmap: the temporary directory goes with the storage, or stays
        super().__init__(max_size, ndim=ndim, checkpointer=checkpointer, device="cpu",
                         auto_cleanup=cleanup_memmap)
        self.consolidated = consolidated  # (TorchRL keeps the flag; _consolidates is False)
        self.cleanup_memmap = cleanup_memmap

    def _create(self, td: TensorDictBase, batched: bool,
                classes: NestedClasses | None = None) -> None:
        if self._unhonoured_device is not None:
            warnings.warn(
                f"LazyTensorStorage(shared_init=True) stores data in CPU memory-mapped files; "
                f"the requested storage device ({self._unhonoured_device}) cannot be honored "
                "and is reset to 'cpu'.", UserWarning, stacklevel=2)
            self._unhonoured_device = None
        super()._create(td, batched, classes)

    def empty_copy(self, checkpointer: StorageCheckpointerBase[Any]) -> SharedLazyTensorStorage:
        """A storage built as this one, empty, with memory-mapped files of its own."""
        copied = SharedLazyTensorStorage(self.max_size, ndim=self.ndim, checkpointer=checkpointer,
                                         cleanup_memmap=self.cleanup_memmap)
        copied.consolidated = self.consolidated
        return copied

    def __repr__(self) -> str:
        shape = None if self.shape is None else tuple(self.shape)
        return (f"LazyTensorStorage(max_size={self.max_size}, ndim={self.ndim}, shape={shape}, "
                f"len={len(self)}, device=cpu, shared_init=True)")


LazyTensorStorage.shared_init_class = SharedLazyTensorStorage
