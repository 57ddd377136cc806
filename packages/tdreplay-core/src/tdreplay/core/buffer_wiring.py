"""Changing what a buffer is made of: its storage, sampler, writer, generator and transforms.

:class:`BufferWiringMixin` is one of the rooms :class:`~tdreplay.core.ReplayBuffer` is built
from: each change holds the buffer's lock and drops the batches drawn ahead from the old parts.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from .sampler import Sampler
from .storage import Storage
from .transform import Compose, InvertedTransform, Transform, as_transform
from .utils import check_flag, check_instance
from .writer import Writer

SelfT = TypeVar("SelfT", bound="BufferWiringMixin")


class BufferWiringMixin:
    """``set_storage`` / ``set_sampler`` / ``set_writer`` / ``set_rng`` and the transforms
    (mixed into :class:`ReplayBuffer`)."""

    _storage: Storage
    _sampler: Sampler
    _writer: Writer
    _rng: torch.Generator | None
    _batch_size: int | None
    _transform: Compose
    _collate_fn: Callable[[Any], Any]
    _lock: AbstractContextManager[Any]
    _sampler_taken_as_is: bool

    if TYPE_CHECKING:  # what the buffer this is mixed into provides
        def clear_prefetch(self) -> None: ...

        def _share_new_transform(self, transform: Transform) -> None: ...

        def _check_parts(self, storage: Storage, sampler: Sampler, writer: Writer) -> None: ...

        def _read_storage(self, storage: Storage) -> None: ...

        shared: bool

        def _written_slots(self) -> torch.Tensor: ...

        @staticmethod
        def _relearn(sampler: Sampler, written: torch.Tensor) -> None: ...

    def set_storage(self, storage: Storage, collate_fn: Callable[[Any], Any] | None = None
                    ) -> Storage:
        """Replace the storage; returns the previous one. ``collate_fn`` resets unless given.

        The sampler forgets what it knew of the previous storage (priorities, an epoch, a
        slice index) and takes the written slots of ``storage`` (each with the default
        priority), as a buffer built over ``storage`` would; the writer goes on after its
        written rows.

        Examples
        --------
        >>> from tdreplay.core import ListStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=ListStorage(4))
        >>> _ = rb.extend([0, 1, 2, 3])
        >>> filled = ListStorage(8)
        >>> filled.set(range(5), [10, 11, 12, 13, 14])
        >>> _ = rb.set_storage(filled)
        >>> len(rb), sorted(set(rb.sample(200)))
        (5, [10, 11, 12, 13, 14])
        """
        check_instance(storage, Storage, "storage")
        self._check_parts(storage, self._sampler, self._writer)  # e.g. a consuming sampler
        with self._lock:
            previous = self._storage
            self._storage = storage
            self._read_storage(storage)  # (buffer_readers)
            self._sampler.learn_written_slots(storage)
            self._writer.register_storage(storage)
            self._collate_fn = collate_fn if collate_fn is not None else storage.default_collate
            self.clear_prefetch()
        return previous

    def _check_sampler_batch_size(self, sampler: Sampler) -> None:
        """``ValueError`` (TorchRL's message) when ``sampler`` needs a batch size known in
        advance (:attr:`Sampler.requires_batch_size`) and the buffer has none."""
        if self._batch_size is None and sampler.requires_batch_size:
            raise ValueError(
                "Samplers with drop_last=True must work with a predictable batch-size. "
                f"Please pass the batch-size to the ReplayBuffer constructor ({sampler!r} drops "
                "the last incomplete batch of an epoch: it needs the buffer's batch_size).")

    def set_sampler(self, sampler: Sampler) -> Sampler:
        """Replace the sampler; returns the previous one.

        The sampler is taken as it is (its priorities, its epoch): when it draws a slot the
        storage does not hold (a sampler used with another storage), it learns the storage's
        written slots anew, as after a restore made past the buffer.

        A sampler that needs a batch size known in advance (e.g.
        ``SamplerWithoutReplacement(drop_last=True)``) is refused with a ``ValueError`` by a
        buffer built without ``batch_size``, a consuming sampler by a buffer that prefetches
        or whose storage or writer it cannot work with (:mod:`~tdreplay.core.buffer_consume`);
        the buffer keeps its sampler.
        """
        check_instance(sampler, Sampler, "sampler")
        if self.shared:  # (as the constructor of a shared buffer refuses it)
            sampler.check_shareable()
        self._check_sampler_batch_size(sampler)
        self._check_parts(self._storage, sampler, self._writer)  # consuming: no prefetch, ...
        with self._lock:
            previous = self._sampler
            self._sampler = sampler
            self._sampler_taken_as_is = True  # (it may draw another storage's slots: _sample)
            if self._rng is not None:
                sampler.set_rng(self._rng)
            self.clear_prefetch()
        return previous

    def set_writer(self, writer: Writer) -> Writer:
        """Replace the writer; returns the previous one."""
        check_instance(writer, Writer, "writer")
        if self.shared:
            writer.check_shareable()
        self._check_parts(self._storage, self._sampler, writer)
        with self._lock:
            previous = self._writer
            self._writer = writer
            writer.register_storage(self._storage)
        return previous

    def set_rng(self, generator: torch.Generator) -> None:
        """Use ``generator`` for every random draw of the sampler."""
        if not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}.")
        with self._lock:  # (batches drawn ahead came from the previous generator)
            self._rng = generator
            self._sampler.set_rng(generator)
            self.clear_prefetch()

    def append_transform(self: SelfT, transform: Transform | Callable[[Any], Any], *,
                         invert: bool = False) -> SelfT:
        """Append a transform; with ``invert=True`` it runs on writes instead of samples.

        Examples
        --------
        >>> from tensordict import TensorDict
        >>> from tdreplay.core import ListStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=ListStorage(10))
        >>> def add_one(data):
        ...     data += 1
        ...     return data
        >>> _ = rb.append_transform(add_one, invert=True)
        >>> data = TensorDict({"a": torch.zeros(3)}, [3])
        >>> _ = rb.extend(data)
        >>> bool((data["a"] == 1).all())
        True
        """
        check_flag(invert, "invert")
        transform = as_transform(transform)
        self._share_new_transform(transform)  # a shared buffer shares it (buffer_sharing)
        with self._lock:  # (batches drawn ahead went through the transforms before)
            self._transform.append(InvertedTransform(transform) if invert else transform)
            self.clear_prefetch()
        return self

    def insert_transform(self: SelfT, index: int, transform: Transform | Callable[[Any], Any], *,
                         invert: bool = False) -> SelfT:
        """Insert a transform at ``index`` (see :meth:`append_transform`)."""
        check_flag(invert, "invert")
        transform = as_transform(transform)
        self._share_new_transform(transform)
        with self._lock:
            self._transform.insert(index, InvertedTransform(transform) if invert else transform)
            self.clear_prefetch()
        return self

