"""Consuming buffers (TorchRL's ``consume_after_n_samples=``): items used up by sampling.

:class:`ConsumptionMixin` is one of the rooms :class:`~tdreplay.core.ReplayBuffer` is built
from. A sampler that consumes items (:attr:`Sampler.max_sample_count`, e.g.
:class:`~tdreplay.core.ConsumingSampler`) changes three things of its buffer: ``len(rb)`` counts
the items still sampleable (:meth:`Sampler.sampleable_count`), writes fill the consumed slots
first (:meth:`Sampler.reusable_slots`, written through :meth:`Writer.write_at` /
:meth:`Writer.extend_reusing`), and ``prefetch`` is refused (a batch drawn ahead would consume
items nobody asked for). Everything happens under the buffer's lock.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import torch

from .consuming import ConsumingSampler, check_max_sample_count
from .sampler import RandomSampler, Sampler
from .storage import Storage
from .utils import leading_dim
from .writer import Writer


def consuming_sampler(sampler: Sampler, consume_after_n_samples: Any) -> Sampler:
    """The sampler of a buffer built with ``sampler`` and ``consume_after_n_samples``.

    ``None`` leaves ``sampler`` as given. A count turns the default sampler (a
    :class:`~tdreplay.core.RandomSampler`) into a :class:`~tdreplay.core.ConsumingSampler` of
    that count (with the same generator); a consuming sampler must have that count. Other
    samplers are refused (``ValueError``, as TorchRL), as are counts that are not positive ints
    (``TypeError`` / ``ValueError`` naming ``consume_after_n_samples``).

    Examples
    --------
    >>> consuming_sampler(RandomSampler(), 2)
    ConsumingSampler(max_sample_count=2, sampleable=0, consumed=0)
    >>> consuming_sampler(RandomSampler(), None)
    RandomSampler()
    """
    if consume_after_n_samples is None:
        return sampler
    count = check_max_sample_count(consume_after_n_samples, "consume_after_n_samples")
    if sampler.max_sample_count is not None:
        if sampler.max_sample_count != count:
            raise ValueError(
                f"consume_after_n_samples={count} conflicts with the sampler's max_sample_count="
                f"{sampler.max_sample_count} ({sampler!r}): pass one of them, or the same value.")
        return sampler
    if not isinstance(sampler, RandomSampler):
        raise ValueError(
            "consume_after_n_samples only supports the default RandomSampler or an explicit "
            f"ConsumingSampler, got {type(sampler).__name__}: prioritized, slice and "
            "without-replacement samplers cannot consume items.")
    made = ConsumingSampler(count)
    made.set_rng(sampler.generator)
    return made


def check_consumption(storage: Storage, sampler: Sampler, writer: Writer, prefetch: int) -> None:
    """Refuse parts a consuming ``sampler`` cannot work with (nothing to check when it does not
    consume): ``prefetch`` (``ValueError``), a storage of ``ndim != 1`` (``ValueError``), a
    writer that cannot write at chosen rows (``TypeError``: :attr:`Writer.supports_write_at`).

    Examples
    --------
    >>> from tdreplay.core import ListStorage, RoundRobinWriter
    >>> check_consumption(ListStorage(4), ConsumingSampler(), RoundRobinWriter(), prefetch=2)
    Traceback (most recent call last):
    ...
    ValueError: Prefetching is not supported with ConsumingSampler (consume_after_n_samples): ...
    """
    if sampler.max_sample_count is None:
        return
    name = type(sampler).__name__
    if prefetch:
        raise ValueError(f"Prefetching is not supported with {name} (consume_after_n_samples):"
                         f" batches drawn ahead would consume items; got prefetch={prefetch}.")
    if storage.ndim != 1:
        raise ValueError(f"{name} only supports 1-dimensional storages, got storage.ndim="
                         f"{storage.ndim}.")
    if not (writer.supports_write_at and callable(writer.write_at)):
        raise TypeError(f"{name} requires a writer with a callable write_at(index, data) method "
                        f"(it writes into consumed slots); {type(writer).__name__} has none.")


class ConsumptionMixin:
    """``len`` and writes of a buffer whose sampler may consume items (mixed into
    :class:`~tdreplay.core.ReplayBuffer`)."""

    _storage: Storage
    _sampler: Sampler
    _writer: Writer
    _prefetch: int
    _lock: AbstractContextManager[Any]

    @property
    def consume_after_n_samples(self) -> int | None:
        """How many times an item is sampled before it is consumed (``None``: never), as
        given to the buffer or by its sampler's :attr:`~Sampler.max_sample_count`.

        Examples
        --------
        >>> from tdreplay.core import ListStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=ListStorage(4), consume_after_n_samples=1)
        >>> rb.consume_after_n_samples, type(rb.sampler).__name__
        (1, 'ConsumingSampler')
        >>> _ = rb.extend([torch.tensor(i) for i in range(4)])
        >>> sorted(rb.sample(3).tolist() + rb.sample(3).tolist()), len(rb)
        ([0, 1, 2, 3], 0)
        """
        return self._sampler.max_sample_count

    def _check_parts(self, storage: Storage, sampler: Sampler, writer: Writer) -> None:
        check_consumption(storage, sampler, writer, self._prefetch)

    def _sampleable(self) -> int:
        """``len(rb)``: the written items, or those not consumed yet."""
        if self._sampler.max_sample_count is None:
            return len(self._storage)
        with self._lock:
            return self._sampler.sampleable_count(self._storage)

    def _add_row(self, data: Any) -> int | torch.Tensor | None:
        """Write one item through the writer, into the sampler's oldest consumed slot if any;
        returns its row. The caller holds the lock."""
        if self._sampler.max_sample_count is not None:
            free = self._sampler.reusable_slots(self._storage, 1)
            if free.numel():
                return self._writer.write_at(int(free[0]), data)
        return self._writer.add(data)

    def _extend_rows(self, data: Any) -> torch.Tensor:
        """Write a batch through the writer, into the sampler's consumed slots first; returns
        the rows written. The caller holds the lock."""
        if self._sampler.max_sample_count is not None:
            free = self._sampler.reusable_slots(self._storage, leading_dim(data))
            if free.numel():
                return self._writer.extend_reusing(free, data)
        return self._writer.extend(data)
