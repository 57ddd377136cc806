"""``ReplayBuffer`` and ``TensorDictReplayBuffer``: one storage, one sampler, one writer."""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Callable
from typing import Any, cast

import numpy as np
import torch
from tensordict import LazyStackedTensorDict, TensorDictBase, is_tensor_collection

from .buffer_conditional import ConditionalUpdateMixin
from .buffer_consume import ConsumptionMixin
from .buffer_dim_extend import ExtendDimMixin, _move_dim, other_dims_mismatch
from .buffer_draw import DrawMixin
from .buffer_edits import InPlaceEditsMixin
from .buffer_items import warn_if_batched_item
from .buffer_iteration import IterationMixin, NextBatchMixin
from .buffer_lock import BufferLock, ReplayBufferLock
from .buffer_parts import PartsMixin, check_transform_args, delays_init
from .buffer_query import QueryMixin
from .buffer_rate_limit import RateLimitedMixin
from .buffer_read_path import ReadPathMixin
from .buffer_readers import StorageReadersMixin
from .buffer_sample_unit import SampleUnitMixin
from .buffer_sharing import SharingMixin, check_shared_flag
from .buffer_wiring import BufferWiringMixin
from .buffer_written import WrittenRowsMixin, one_slot_per_row
from .prefetch import Prefetcher, note_drawn
from .rate_limit import RateLimiter
from .sample_units import SampleUnit
from .sampler import Sampler
from .service_backends import ServiceBackendMixin, ServiceDispatch
from .storage import Storage, StorageCheckpointerBase
from .transform import Compose, Transform
from .transform_state import write_side_undone_on_failure
from .utils import (
    NotATensorDictError,
    as_long_tensor,
    check_count,
    check_flag,
    check_instance,
    ensure_update_tensordict,
    errors_named,
    leading_dim,
    restore_attributes,
)
from .writer import Writer


def _check_flags(compilable: Any, delayed_init: Any, transform_factory: Any) -> tuple[bool, bool]:
    """``(compilable, delayed)``; ``TypeError`` naming the argument unless ``compilable`` is a
    bool or None (None, TorchRL's default: False) and ``delayed_init`` a bool or None (None:
    delayed when a ``transform_factory`` is given, as TorchRL's)."""
    compilable = False if compilable is None else check_flag(compilable, "compilable")
    return compilable, delays_init(delayed_init, transform_factory)


def _emptied(item: Any, transformed: Any) -> bool:
    """Whether a write-side transform filtered the one ``item`` out: it returned a tensor
    collection of another batch size holding no element (``td[td["keep"]]`` of an item
    whose ``"keep"`` is False: batch size ``[0]``)."""
    if not is_tensor_collection(transformed):
        return False
    batch_size = transformed.batch_size
    return bool(batch_size.numel() == 0 and batch_size != getattr(item, "batch_size", None))


def _not_a_draw(sampler: Sampler, drawn: Any) -> TypeError:
    """The error for what a sampler's ``sample`` returned when it is not ``(index, info)``."""
    got = (f"a tuple of {len(drawn)}" if isinstance(drawn, tuple) and len(drawn) != 2
           else f"info of type {type(drawn[1]).__name__}" if isinstance(drawn, tuple)
           else f"a {type(drawn).__name__}")
    return TypeError(f"{type(sampler).__name__}.sample(storage, batch_size) must return "
                     f"(index, info), info a dict, got {got}.")


def _per_batch_row(slots: torch.Tensor, positions: torch.Tensor, rows: int) -> torch.Tensor:
    """The slots of each row of a batch of ``rows`` rows of which only those at ``positions``
    were written (to ``slots``, one entry per row written, with the slots of its steps in a
    storage of several dims): ``-1`` for the others, as TorchRL marks rows it did not write."""
    out = torch.full((rows, *slots.shape[1:]), -1, dtype=torch.long)
    out[positions] = slots.to(torch.long).cpu()
    return out


def _leads(shape: torch.Size, batch_size: torch.Size) -> bool:
    """Whether ``shape`` is the leading dims of ``batch_size`` (all of them: compared as they
    are, without slicing a ``torch.Size``, which builds a new one at some cost)."""
    if len(shape) == len(batch_size):
        return shape == batch_size
    return shape == batch_size[: len(shape)]


def _repeat_over(value: torch.Tensor, batch_size: torch.Size) -> torch.Tensor:
    """``value``, shaped as the leading dims of ``batch_size``, repeated over the other ones."""
    if value.ndim == len(batch_size):
        return value
    return value.reshape(value.shape + (1,) * (len(batch_size) - value.ndim)).expand(batch_size)


def _fields_of(data: Any) -> frozenset[str] | None:
    """The names that can be set in ``data``: ``None`` (any) for a TensorDict, the fields of
    a tensorclass (which refuses other names)."""
    if isinstance(data, TensorDictBase):
        return None
    return frozenset(field.name for field in dataclasses.fields(data))


def _holds(data: Any, key: Any) -> bool:
    """Whether ``key`` (a name or a nested key) can be set in ``data``: any key in a TensorDict;
    in a tensorclass, a field, or a key inside a field holding a tensor collection (the
    ``("next", "done")`` of a ``next`` field). See :func:`_fields_of`."""
    fields = _fields_of(data)
    if fields is None:
        return True
    if isinstance(key, str):
        return key in fields
    if not isinstance(key, tuple) or not key or key[0] not in fields:
        return False
    if len(key) == 1:
        return True
    inner = getattr(data, key[0], None)
    return is_tensor_collection(inner) and _holds(inner, key[1:] if len(key) > 2 else key[1])


def _set_per_item(td: TensorDictBase, key: str, value: torch.Tensor) -> bool:
    """Set ``value[i]`` in item ``i`` of a lazy stack of differently shaped TensorDicts.

    Such a stack has ``-1`` in its batch size, so a ``[B]`` entry cannot be set on it whole.
    Returns False (and sets nothing) when ``td`` is not such a stack along dim 0 or a value
    does not fit its item.
    """
    if not isinstance(td, LazyStackedTensorDict) or td.stack_dim != 0 \
            or value.shape[:1] != td.batch_size[:1]:
        return False
    items = td.tensordicts
    if any(v.shape != sub.batch_size[: v.ndim] for sub, v in zip(items, value)):
        return False
    for sub, v in zip(items, value):
        sub.set(key, _repeat_over(v, sub.batch_size))
    return True


class ReplayBuffer(PartsMixin, ExtendDimMixin, BufferWiringMixin, RateLimitedMixin,
                   InPlaceEditsMixin, SharingMixin, ConditionalUpdateMixin, QueryMixin,
                   SampleUnitMixin, ConsumptionMixin, ServiceBackendMixin, ReadPathMixin,
                   DrawMixin, IterationMixin, NextBatchMixin, StorageReadersMixin, WrittenRowsMixin,
                   metaclass=ServiceDispatch):
    """A replay buffer: ``extend`` writes through the writer, ``sample`` reads through the sampler.

    Parameters
    ----------
    storage : Storage, optional
        Where items live. Defaults to ``ListStorage(1000)``.
    sampler : Sampler, optional
        How batches are drawn. Defaults to :class:`RandomSampler`.
    writer : Writer, optional
        Where new items go. Defaults to :class:`RoundRobinWriter`.
    collate_fn : callable, optional
        Turns what the storage returns into a batch. Defaults to the storage's own
        (stacking for a list storage, identity for tensor storages).
    pin_memory : bool
        Pin sampled batches in page-locked memory (when an accelerator is present).
    prefetch : int, optional
        Keep exactly this many batches sampled ahead in a background thread.
    transform : Transform or callable, optional
        Applied to every sample (and, when appended with ``invert=True``, to every write).
    batch_size : int, optional
        Default batch size of :meth:`sample` and iteration (``drop_last`` samplers need it).
    generator : torch.Generator, optional
        Random generator used by the sampler, for reproducible sampling.
    checkpointer : StorageCheckpointerBase, optional
        As TorchRL: becomes the storage's :attr:`~Storage.checkpointer` (how :meth:`dumps`
        writes and :meth:`loads` reads the storage) when the parts are built. ``None`` keeps
        the storage's own (TorchRL's resets a checkpointer set on the storage to the default).
    consume_after_n_samples : int, optional
        Items are consumed once sampled this many times (:mod:`tdreplay.core.buffer_consume`).
    transform_factory : callable, optional
        Returns the transform (as TorchRL); not together with ``transform``.
    compilable : bool, optional
        As TorchRL: goes to the default storage and writer (see :class:`Storage`); ``None``
        (the default, as TorchRL's) means ``False``.
    delayed_init : bool, optional
        As TorchRL: ``True`` builds the parts (``storage``, ``sampler``, ``writer`` may be
        factories; the transform of ``transform_factory``) at the first use of the buffer
        instead of now (:mod:`tdreplay.core.buffer_parts`); ``rb.initialized`` says which.
        Default: ``True`` when ``transform_factory`` is given, else ``False``.
    dim_extend : int, optional
        The batch dim ``extend`` writes along (TorchRL's; default ``storage.ndim - 1``): see
        :attr:`dim_extend` (:mod:`tdreplay.core.buffer_dim_extend`).
    sample_unit : SampleUnit, optional
        What each drawn anchor becomes (:mod:`tdreplay.core.sample_units`; ``None``: itself).
    rate_limiter : RateLimiter, optional
        When ``sample`` and writes may go on (:mod:`tdreplay.core.rate_limit`, as Reverb's).
    shared : bool
        Used by several processes: see :meth:`share` (:mod:`tdreplay.core.buffer_sharing`).
    service_backend, service_backend_options, transport, transport_options
        Where the buffer is served (TorchRL's): ``"direct"`` (default) builds it here;
        ``"ray"`` returns a ``tdreplay.distributed.RayReplayBuffer`` serving this class with
        these arguments (needs ``tdreplay-distributed``). See
        :mod:`tdreplay.core.service_backends`.

    Thread safety: one lock guards writes, index assignment and the read of sampled rows, so a
    collector thread can ``extend`` while learner threads ``sample``; a sample never sees a
    half-written row.

    Examples
    --------
    >>> rb = ReplayBuffer(batch_size=4)
    >>> rb.extend([torch.tensor(float(i)) for i in range(10)]).tolist()
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    >>> rb.sample().shape, len(rb), rb.write_count
    (torch.Size([4]), 10, 10)
    """

    #: Entry of a sampled TensorDict that ``update_tensordict_priority`` reads (``None``: the
    #: buffer does not take priorities from its data; ``TensorDictReplayBuffer`` sets one).
    priority_key: str | None = None
    def __init__(
        self,
        *,
        storage: Storage | None = None,
        sampler: Sampler | None = None,
        writer: Writer | None = None,
        collate_fn: Callable[[Any], Any] | None = None,
        pin_memory: bool = False,
        prefetch: int | None = None,
        transform: Transform | Callable[[Any], Any] | None = None,
        batch_size: int | None = None,
        generator: torch.Generator | None = None,
        checkpointer: StorageCheckpointerBase[Any] | None = None,
        transform_factory: Callable[[], Any] | None = None,
        compilable: bool | None = None,
        delayed_init: bool | None = None,
        rate_limiter: RateLimiter | None = None,
        dim_extend: int | None = None,
        shared: bool = False,
        sample_unit: SampleUnit | None = None,
        consume_after_n_samples: int | None = None,
    ) -> None:
        self.compilable, delayed = _check_flags(compilable, delayed_init, transform_factory)
        check_shared_flag(shared, "shared")  # (before any part is built)
        pin_memory = check_flag(pin_memory, "pin_memory")
        check_transform_args(transform, transform_factory)
        self._set_dim_extend(dim_extend)
        if collate_fn is not None and not callable(collate_fn):
            raise TypeError(f"collate_fn must be callable, got {type(collate_fn).__name__}.")
        self._pin_memory = pin_memory
        self._prefetch = check_count(prefetch, "prefetch", minimum=0) or 0
        self._batch_size = check_count(batch_size, "batch_size", minimum=1)
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator, got "
                            f"{type(generator).__name__}.")
        self._rng: torch.Generator | None = generator
        if checkpointer is not None:
            check_instance(checkpointer, StorageCheckpointerBase, "checkpointer")
        self._lock = ReplayBufferLock(self)
        # read by every draw: an instance attribute (CPython 3.11 reads class defaults slowly)
        self._submitted_updates = None
        self._prefetcher = Prefetcher(self._prefetch, on_clear=self.clear_prefetch)
        self.set_rate_limiter(rate_limiter)
        self.set_sample_unit(sample_unit)
        # the parts (buffer_parts): now, or at the first use with delayed_init
        self._init_parts(delayed, storage=storage, sampler=sampler, writer=writer,
                         transform=transform, transform_factory=transform_factory,
                         collate_fn=collate_fn, consume_after_n_samples=consume_after_n_samples,
                         compilable=self.compilable, checkpointer=checkpointer)
        self.share(shared)  # (only marks a buffer whose parts wait: they are shared when built)

    # ---- components ------------------------------------------------------------------------------
    @property
    def storage(self) -> Storage:
        """The storage of the buffer."""
        return self._storage

    @property
    def sampler(self) -> Sampler:
        """The sampler of the buffer."""
        return self._sampler

    @property
    def writer(self) -> Writer:
        """The writer of the buffer."""
        return self._writer

    @property
    def transform(self) -> Compose:
        """The transforms of the buffer, as a :class:`Compose`."""
        return self._transform

    @property
    def batch_size(self) -> int | None:
        """Default batch size of :meth:`sample` and of iteration."""
        return self._batch_size

    @property
    def collate_fn(self) -> Callable[[Any], Any]:
        """What turns the storage's items into a batch (set with :meth:`set_storage`)."""
        return self._collate_fn

    def locked(self) -> BufferLock:
        """The buffer's lock, as a context manager: what ``extend``, ``sample`` and the other
        methods hold while they touch the storage, the sampler and the writer.

        Code that composes buffers (an ensemble, a service) holds it to read or change several
        components as one step. It is re-entrant: the buffer's own methods may be called under
        it from the same thread. A prefetching buffer sampled under it draws the batch itself
        (its worker needs the lock), and saving it waits only for the batches whose draw is
        over; a sample or a save that would wait for updates submitted with
        ``submit_update_if_present`` (their worker needs the lock too) raises
        ``RuntimeError`` at once: call :meth:`synchronize` before taking the lock. Code that
        takes several buffers' locks enters each with ``enter_if_free()`` (``False``: another
        thread holds it; :class:`~tdreplay.core.buffer_lock.BufferLock`) and, when one is
        busy, gives back the others before it waits.

        Examples
        --------
        >>> from tdreplay.core import ListStorage
        >>> rb = ReplayBuffer(storage=ListStorage(10))
        >>> with rb.locked():
        ...     _ = rb.extend([1, 2])
        ...     n = len(rb)
        >>> n
        2
        """
        return cast(BufferLock, self._lock)

    def holds_lock(self) -> bool:
        """Whether the calling thread holds the buffer's lock (inside :meth:`locked`, or in
        one of the buffer's own calls), or that of another buffer of its storage, which
        shares it.

        A prefetching buffer sampled inside :meth:`locked` draws the batch itself instead of
        waiting for its worker (which needs the lock); an ensemble holds its members' locks.

        Examples
        --------
        >>> from tdreplay.core import ListStorage
        >>> rb = ReplayBuffer(storage=ListStorage(10))
        >>> with rb.locked():
        ...     inside = rb.holds_lock()
        >>> inside, rb.holds_lock()
        (True, False)
        """
        return cast(ReplayBufferLock, self._lock).held_here or self._holds_a_readers_lock()

    @property
    def write_count(self) -> int:
        """Items written through ``add`` and ``extend`` so far."""
        return self._writer.write_count

    # ---- writing ---------------------------------------------------------------------------------
    def _write_side(self, data: Any) -> Any:
        if self._transform.transforms:  # (the list itself: ``len(Compose)`` is one more call)
            data = self._transform.inv(data)
        return data

    @write_side_undone_on_failure
    def add(self, data: Any) -> int | torch.Tensor | None:
        """Add one item; returns the slot (or slots, for ``ndim > 1``) where it lives.

        A TensorDict with a batch size is one item with its batch dims (a ``UserWarning`` says
        so, as TorchRL's does: ``extend`` stores its rows as items). An item a write-side
        transform drops (returns ``None`` for, or filters out of a TensorDict: an empty batch
        where the item had none, e.g. ``PolicyAgeFilter``) is not written: the result is then
        an empty ``[0, storage.ndim]`` tensor of slots, as TorchRL's; an item the
        writer does not keep (``TensorDictMaxValueWriter``, ranked too low) gives ``None``, as
        TorchRL's."""
        warn_if_batched_item(data, self._storage.ndim - 1)
        data = self._write_side_item(data)
        if data is None:
            return self._nothing_added()
        with self._write_lock(data, single=True):
            return self._write_item(data)

    def _write_side_item(self, item: Any) -> Any:
        """The one ``item`` after the write-side transforms; ``None`` when they dropped it
        (returned ``None``, or filtered it out of a TensorDict: see :func:`_emptied`)."""
        transformed = self._write_side(item)
        if transformed is not item and transformed is not None and _emptied(item, transformed):
            return None
        return transformed

    def _nothing_added(self) -> torch.Tensor:
        """What ``add`` and ``extend`` return for data a write-side transform dropped (an
        empty ``[0, storage.ndim]`` tensor of slots, TorchRL's)."""
        return torch.zeros((0, self._storage.ndim), dtype=torch.long)

    def _write_item(self, data: Any) -> int | torch.Tensor | None:
        """Write one item (write-side transforms done) and tell the sampler; lock held. ``None``
        when the writer did not keep it (``TensorDictMaxValueWriter``), as TorchRL's."""
        self._check_writing_process()  # a forked child writes only what is shared
        if type(self._sampler).check_write is not Sampler.check_write:
            self._sampler.check_write(data)
        row = None
        try:  # (no cost unless raised)
            row = self._add_row(data)
            if type(row) is int and self._storage.row_numel == 1:  # one row, one slot
                self._sampler.add(row)
                if self._readers.shared:  # other buffers read the storage (buffer_readers)
                    self._tell_readers_written(row)
                return row
            if row is None:  # a writer that did not keep it (TorchRL's convention)
                return None
            rows = torch.as_tensor(row, dtype=torch.long).reshape(-1)
            if not rows.numel():
                return None
            slots = self._tell_written(rows)
        except BaseException:
            self._tell_interrupted(row)
            raise
        if self._storage.row_numel == 1 and rows.numel() == 1:
            return int(rows)
        return slots.reshape(slots.shape[1:]) if slots.shape[0] == 1 else slots

    @write_side_undone_on_failure
    def extend(self, data: Any, *, update_priority: bool | None = None) -> torch.Tensor:
        """Write a batch; returns the slots written, one entry per row of the batch (``-1``
        for a row the writer did not keep, e.g. ``TensorDictMaxValueWriter``'s, as TorchRL).

        A list is a batch of items, a tuple one pytree batched along dim 0 of its leaves, a
        tensor or TensorDict a batch along its first dimension. ``update_priority`` is
        :class:`TensorDictReplayBuffer`'s (whether the batch's priority entry sets the
        priorities): this class reads no priorities from its data, so any value but ``None``
        raises ``NotImplementedError``, as TorchRL's. A batch a write-side transform drops
        (returns ``None`` for) is not written: the result is an empty ``[0, storage.ndim]``
        tensor of slots, as TorchRL's.
        """
        if update_priority is not None:
            raise NotImplementedError(
                f"update_priority={update_priority!r}: {type(self).__name__}.extend takes no "
                "priorities from its data (TensorDictReplayBuffer.extend does); set them with "
                "update_priority(index, priority).")
        data, dim = self._prepare_batch(data)
        if data is None:  # a write-side transform dropped the batch
            return self._nothing_added()
        with self._write_lock(data):
            return self._slots_as_given(self._write_batch(data), data, dim)

    def _slots_as_given(self, slots: torch.Tensor, data: Any, dim: int) -> torch.Tensor:
        """The ``slots`` written for ``data`` (the batch :meth:`_prepare_batch` made), in the
        layout of the batch ``extend`` got: one entry per row, ``-1`` for a row the writer did
        not keep (e.g. ``TensorDictMaxValueWriter``'s, which says which it kept), ``dim``
        moved back."""
        kept = self._writer.written_positions
        if kept is not None:
            slots = _per_batch_row(slots, kept, leading_dim(data))
        return self._written_as_given(slots, data, dim) if dim else slots

    def _write_batch(self, data: Any, priority: Any = None, rows_given: int = -1) -> torch.Tensor:
        """Write a prepared batch and tell the sampler (the caller holds the lock), with the
        checked ``priority`` of its ``rows_given`` rows if each went to one slot of its own."""
        self._check_writing_process()
        if type(self._sampler).check_write is not Sampler.check_write:
            self._sampler.check_write(data)  # (the base's accepts anything: not called)
        rows = None
        try:  # (no cost unless raised)
            rows = self._extend_rows(data)  # consumed slots first (buffer_consume)
            return self._tell_written(rows, priority, rows_given)
        except ValueError as err:  # the writer's: refused before anything was written; say
            # why in the batch's own layout when it is its number of environments
            # (buffer_dim_extend)
            mismatch = None if rows is not None else \
                other_dims_mismatch(data, self._storage.shape, self.dim_extend)
            if mismatch is None:
                raise
            raise mismatch from err
        except BaseException:
            self._tell_interrupted(rows, priority, rows_given)
            raise

    # ---- reading ---------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._sampleable()  # the items written, less those consumed (buffer_consume)

    def read_all_in_order(self, end: int | None = None) -> Any:
        """Storage contents in physical order, ``rb[:end]`` (``rb[:]`` when ``end`` is None)."""
        return self[slice(None, end)]

    def _resolve_batch_size(self, batch_size: int | None) -> int:
        if batch_size is None:
            batch_size = self._batch_size
            if batch_size is None:
                raise RuntimeError("batch_size not specified: pass one to sample() or build "
                                   "the buffer with batch_size=...")
            return batch_size
        checked = check_count(batch_size, "batch_size", minimum=1)
        assert checked is not None  # batch_size is not None here
        return checked

    def _sample(self, batch_size: int, prefetch_epoch: int | None = None,
                marked: bool = False) -> tuple[Any, dict[str, Any]] | None:
        # a draw that changes state (a sampler's stateful draws, read-side transforms with state)
        # is undone if a step fails (buffer_draw)
        if not marked and (self._sampler.stateful_draws or self.has_read_state):
            return self._sample_undoably(batch_size, prefetch_epoch)
        with self._lock:
            if prefetch_epoch is not None and prefetch_epoch != self._prefetcher.epoch:
                return None  # queued for prefetch, then dropped: draw nothing
            if self._rate_limiter is not None:  # (emptied since its gate let the sample in?)
                self._check_min_size()
            try:
                drawn = self._sampler.sample(self._storage, batch_size)
            except IndexError:  # a slot the storage does not hold: a sampler set onto the
                # buffer from another storage? (set_sampler: it learns this one's)
                if not self._sampler_taken_as_is:
                    raise
                self._sampler_taken_as_is = False
                self._sampler.learn_written_slots(self._storage)
                drawn = self._sampler.sample(self._storage, batch_size)
            if not isinstance(drawn, tuple) or len(drawn) != 2 or not isinstance(drawn[1], dict):
                raise _not_a_draw(self._sampler, drawn)
            index, info = drawn
            if isinstance(index, np.ndarray) or (type(index) is list and index
                                                 and isinstance(index[0], (int, np.integer))):
                # (slots from a sampler of your own: the sample's "index" is an int64 tensor;
                # an ensemble's list of parts stays one)
                index = as_long_tensor(index, name="index")
            if self._sample_unit is not None:
                index, info = self._expand_anchors(index, info)
            generations = self._writer.sample_info(index)
            if generations:
                info.update(generations)
            info["index"] = index
            data, extra = self._read_sampled(index, info)
            if prefetch_epoch is not None:  # drawn ahead: said before the lock goes
                note_drawn()
        data = self._complete_sample(self._collate_fn(data), info, extra)
        # Info goes in before the read transforms, so they see where each item came from (slice
        # ends, indices), and again after them for any entry a transform dropped.
        data = self.attach_info(data, info)
        if self._transform.transforms:
            data = self._transform(data)
            data = self.attach_info(data, info, only_missing=True)
        if self._pin_memory and torch.cuda.is_available():
            data = data.pin_memory()
        return data, info

    def sample(self, batch_size: int | None = None, return_info: bool = False) -> Any:
        """Sample a batch; with ``return_info`` returns ``(batch, info)``.

        ``info`` holds ``index`` (the slots sampled) and whatever the sampler adds.
        """
        if return_info is not False and return_info is not True:  # (one check when a bool)
            check_flag(return_info, "return_info")
        bs = self._resolve_batch_size(batch_size)
        if self._rate_limiter is None and not self._prefetch:  # the common case, no gate
            data, info = self._draw(bs)
        else:
            data, info = self._limited_draw(bs, self._next_batch)
        return (data, info) if return_info else data

    def _next_batch(self, batch_size: int) -> tuple[Any, dict[str, Any]]:
        """The next batch of ``batch_size``: from the prefetch queue when the buffer
        prefetches batches of that size from an endless sampler, else drawn now."""
        if (self._prefetch and batch_size == (self._batch_size or batch_size)
                and not self._sampler_is_finite() and not self.holds_lock()):
            self._follow_untold_resets()
            self._drop_batches_of_replaced_rows()
            return self._prefetcher.next(batch_size, self._sample_ahead)
        # (inside locked(): the worker drawing ahead needs the lock, so draw here; the
        # batches queued stay queued, in order, for the samples after the lock is let go)
        return self._draw(batch_size)

    def _sampler_is_finite(self) -> bool:
        return self._sampler.finite_epochs

    def clear_prefetch(self) -> None:
        """Drop the batches sampled ahead (``prefetch``): the next sample draws afresh.

        The buffer calls it whenever what a queued batch was drawn from changes (a new
        storage or sampler, ``empty``, a restored state), and at the next sample when another
        process has emptied or restored a storage they share
        (``Storage.shared_reset_count()``).
        """
        self._prefetcher.clear()

    def update_priority(self, index: Any, priority: Any, *, write_generation: Any = None) -> None:
        """Set the priorities of ``index`` (prioritized samplers); ``write_generation`` (the
        sample's ``info["write_generation"]``) lets the sampler skip slots rewritten since."""
        extra = {} if write_generation is None else {"write_generation": write_generation}
        with self._lock:
            self._check_writing_process()  # (a forked child's priorities would stay its own)
            self._sampler.update_priority(index, priority, storage=self._storage, **extra)

    # ---- lifecycle -------------------------------------------------------------------------------
    def empty(self, empty_write_count: bool = True) -> None:
        """Remove every item and reset the write cursor (and the write count by default) and
        the rate limiter's counts (as Reverb's ``Table.reset``: the counts of the items gone
        would hold back or let through the calls on the new ones)."""
        check_flag(empty_write_count, "empty_write_count")
        with self._lock:
            self._check_writing_process()  # a forked child empties only what is shared
            self._check_storage_writers("empty")  # (a dataset's refuses: nothing changed)
            self.clear_prefetch()
            with self._replacing_rows_itself():  # (the others are told: buffer_readers)
                self._storage.empty()
            self._followed_own_reset()
            self._writer.empty(empty_write_count)
            self._sampler.empty()
            self._sampler_taken_as_is = False
            self._transform.drop_held_items()  # (steps a MultiStepTransform held back)
            if self._rate_limiter is not None:
                self._rate_limiter.reset()
            if self._install_record is not None:  # (nothing of a half-restored state is left)
                self._install_record.clear()
            self._tell_readers_emptied(empty_write_count)

    def __repr__(self) -> str:
        if not self.initialized:  # (does not build the parts)
            return f"{type(self).__name__}(initialized=False, batch_size={self._batch_size})"
        return (
            f"{type(self).__name__}(\n    storage={self._storage!r},"
            f"\n    sampler={self._sampler!r},"
            f"\n    writer={self._writer!r},\n    batch_size={self._batch_size},"
            f"\n    transform={self._transform!r})"
        )

    def __setstate__(self, state: dict[str, Any]) -> None:  # (__getstate__: BufferStateMixin)
        prefetched = state.pop("_prefetch_state", None)
        restore_attributes(self, state)
        self._owner_pid = os.getpid()  # a copy belongs to its process
        self._lock = ReplayBufferLock(self)
        if self._pending_parts is not None:  # pickled before its first use: waits again
            self._wait_for_first_use(self._pending_parts)
        else:  # the copy reads its own copy of the storage
            self._read_storage(self._storage)
        self._prefetcher = Prefetcher(self._prefetch, on_clear=self.clear_prefetch)
        self._prefetcher.restore(prefetched)

    def __del__(self) -> None:
        prefetcher = getattr(self, "_prefetcher", None)  # (a buffer whose __init__ failed)
        if prefetcher is not None:
            prefetcher.shutdown()


class TensorDictReplayBuffer(ReplayBuffer):
    """A replay buffer of TensorDicts that writes ``index`` (and sampler info) into samples.

    Parameters
    ----------
    priority_key : str
        Entry read by :meth:`update_tensordict_priority` (``"td_error"`` by default).
    **kwargs
        As :class:`ReplayBuffer`.

    ``extend`` and ``add`` leave the TensorDict they are given as it was (as TorchRL's, which
    writes a shallow copy): the slots written are what they return, and every sample carries
    its ``index``.

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> from tdreplay.core import ListStorage
    >>> rb = TensorDictReplayBuffer(storage=ListStorage(10), batch_size=2)
    >>> td = TensorDict({"obs": torch.arange(4.)}, [4])
    >>> rb.extend(td).tolist(), sorted(td.keys())
    ([0, 1, 2, 3], ['obs'])
    >>> s = rb.sample()
    >>> bool((s["obs"] == s["index"].float()).all())
    True
    """

    def __init__(self, *, priority_key: str = "td_error", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.priority_key = priority_key

    @write_side_undone_on_failure
    def extend(self, tensordicts: TensorDictBase, *, update_priority: bool | None = None
               ) -> torch.Tensor:
        """Write a batch of TensorDicts (left as it is, as TorchRL's); for prioritized samplers,
        reads its ``priority_key`` (when present) as the initial priorities, checked before
        anything is written. Returns what :meth:`ReplayBuffer.extend` returns."""
        if not is_tensor_collection(tensordicts):
            raise NotATensorDictError("TensorDictReplayBuffer.extend expects a TensorDict, got "
                                      f"{type(tensordicts).__name__}.")
        update_priority = check_flag(update_priority, "update_priority", allow_none=True)
        present = tensordicts.keys()
        data, dim = self._prepare_batch(self._without_bookkeeping(tensordicts, present))
        if data is None:  # a write-side transform dropped the batch
            return self._nothing_added()
        if self._transform.transforms:
            # the priorities of the rows written, as TorchRL reads them: write-side transforms
            # may hold rows back, reorder or make them (MultiStepTransform), so the batch
            # given is not row for row what is written (in the layout given: dim moved back)
            tensordicts = _move_dim(data, dim) if dim else data
        priority = self._priority_to_write(tensordicts, update_priority)
        # along dim 0, the rows written are the batch's rows: the sampler can take their
        # priorities with the slots (one call, not an extend and then an update)
        rows_given = (tensordicts.batch_size[0]
                      if priority is not None and not dim and tensordicts.batch_dims else -1)
        with self._write_lock(data):
            written = self._write_batch(data, priority, rows_given)
            slots = self._slots_as_given(written, data, dim)
            if priority is not None and written.numel() and not one_slot_per_row(written,
                                                                                  rows_given):
                self._prioritize_written(written, slots, priority, dim, tensordicts)
            return slots

    def _prioritize_written(self, written: torch.Tensor, slots: torch.Tensor, priority: Any,
                            dim: int, given: TensorDictBase) -> None:
        """Give the slots ``written`` (the writer's result for the batch ``given``; ``slots``:
        the same in ``given``'s layout) the batch's ``priority`` (checked) where the write did
        not."""
        batch_size = given.batch_size
        # a writer may keep only some rows (e.g. TensorDictMaxValueWriter): it says which
        kept = self._writer.written_positions
        if kept is not None:
            rows = given.get(self.priority_key)  # (checked) the kept rows', along dim first
            if rows.ndim > dim:
                rows = (rows.transpose(0, dim) if dim else rows)[kept]
            self._sampler.update_priority(written, rows, storage=self._storage)
            return
        if _leads(slots.shape, batch_size):
            self._sampler.update_priority(slots, priority, storage=self._storage)
        else:
            warnings.warn(
                f"the writer kept {slots.shape[0]} of {batch_size[0]} rows: their "
                f"{self.priority_key!r} cannot be matched to the rows written, which get the "
                "max priority instead.", stacklevel=3)

    @property
    def bookkeeping_keys(self) -> tuple[str, ...]:
        """The entries a write leaves out of its data: ``index`` (where a row lives) and the
        sampler's and writer's per-item info (e.g. ``priority_weight``), bookkeeping of a
        previous write or sample, never stored as data (a sample written back, or an item
        added twice, has the storage's keys).

        Examples
        --------
        >>> from tdreplay.core import ListStorage
        >>> TensorDictReplayBuffer(storage=ListStorage(4)).bookkeeping_keys
        ('index',)
        """
        return ("index", *self._sampler.info_keys, *self._writer.info_keys)

    def _without_bookkeeping(self, td: TensorDictBase, present: Any = None) -> TensorDictBase:
        """``td`` without its :attr:`bookkeeping_keys`. ``present``: ``td.keys()`` when the
        caller has it already."""
        present = td.keys() if present is None else present
        bookkeeping = [k for k in self.bookkeeping_keys if k in present]
        return td.exclude(*bookkeeping) if bookkeeping else td

    def _priority_to_write(self, data: TensorDictBase, update_priority: bool | None) -> Any:
        """The priorities ``data`` brings for a prioritized sampler, checked before any write
        (as :meth:`Sampler.check_priority` returns them)."""
        if update_priority is False or not self._sampler.is_prioritized:
            return None
        priority = data.get(self.priority_key, None)
        if priority is not None:
            if not isinstance(priority, torch.Tensor):  # a string, a nested TensorDict
                raise TypeError(f"the priority entry {self.priority_key!r} must be a tensor of "
                                f"numbers, got {type(priority).__name__}.")
            checked = self._sampler.check_priority(priority)
            return priority if checked is None else checked
        return priority

    @write_side_undone_on_failure
    def add(self, data: TensorDictBase) -> int | torch.Tensor | None:
        if not is_tensor_collection(data):
            raise NotATensorDictError("TensorDictReplayBuffer.add expects a TensorDict, got "
                                      f"{type(data).__name__}.")
        warn_if_batched_item(data, self._storage.ndim - 1)
        item = self._write_side_item(self._without_bookkeeping(data))
        if item is None:  # dropped by a write-side transform
            return self._nothing_added()
        # the priority of the item written (a write-side transform may change it), as TorchRL's
        priority = self._priority_to_write(item if self._transform.transforms else data, None)
        if item is data and self._storage.keeps_written_objects:
            # a shallow copy, as TorchRL's add writes: entries set in the caller's TensorDict
            # afterwards (env.step(td) sets "next") stay out of the stored item
            item = data.copy()
        with self._write_lock(item, single=True):
            index = self._write_item(item)
            if priority is not None and index is not None:
                self._sampler.update_priority(index, priority, storage=self._storage)
        return index

    def attach_info(self, data: Any, info: dict[str, Any], only_missing: bool = False) -> Any:
        if not is_tensor_collection(data):
            # (what the storage's own collate made, before a read transform: a collate_fn
            # given to the buffer may make anything)
            if not only_missing and self._collate_fn == self._storage.default_collate:
                raise TypeError(
                    f"{type(self).__name__} sampled a {type(data).__name__} from its "
                    f"{type(self._storage).__name__}, not a TensorDict: the storage's get and "
                    "default_collate made no TensorDict of the items, so the sample could not "
                    "carry its index and priority weights. Give the storage a default_collate "
                    "(e.g. tdreplay.core.stack_items) or pass collate_fn=.")
            return data
        batch = data.batch_size
        fields = _fields_of(data)
        for key, value in info.items():
            if not isinstance(value, torch.Tensor):
                continue
            if only_missing and data.get(key, None) is not None:
                continue
            if fields is not None and not _holds(data, key):  # a tensorclass without that
                continue  # field: in the info dict only
            if data.device is not None and value.device != data.device:
                value = value.to(data.device)
            if -1 in batch and _set_per_item(data, key, value):
                continue
            if value.shape[: len(batch)] == batch:
                pass
            elif value.shape == batch[: value.ndim]:
                value = _repeat_over(value, batch)
            elif value.ndim >= 1 and value.shape[0] == batch.numel():
                value = value.reshape(batch + value.shape[1:])
            else:
                warnings.warn(f"sample info {key!r} of shape {tuple(value.shape)} does not fit the "
                              f"sample's batch size {tuple(batch)}; it is only in the info dict.",
                              stacklevel=3)
                continue
            if data.is_locked:
                data = data.unlock_()
            data.set(key, value)
        return data

    def sample(self, batch_size: int | None = None, return_info: bool = False,
               include_info: bool | None = None) -> Any:
        """Sample a TensorDict batch carrying ``index`` and the sampler's info entries."""
        if include_info is not None:
            check_flag(include_info, "include_info", allow_none=True)
            warnings.warn("include_info is ignored: info entries are always written into the "
                          "sampled TensorDict.", DeprecationWarning, stacklevel=2)
        return super().sample(batch_size, return_info=return_info)

    def update_tensordict_priority(self, data: TensorDictBase) -> None:
        """Update priorities from ``data[priority_key]`` at ``data["index"]``.

        Does nothing when the sampler is not prioritized.
        """
        if not self._sampler.is_prioritized:
            return
        data = ensure_update_tensordict(data)
        index = data.get("index", None)
        if index is None:
            raise KeyError("update_tensordict_priority needs an 'index' entry in data (samples "
                           "carry one; a tensorclass, only if it has an 'index' field: else "
                           "pass the info's index, or the slots extend returned, to "
                           "update_priority).")
        priority = data.get(self.priority_key, None)
        if priority is None:
            raise KeyError(f"update_tensordict_priority needs the priority entry "
                           f"{self.priority_key!r} in data.")
        # hand back what the sampler asked to see again (e.g. write generations, to skip rows
        # overwritten since the sample)
        extra = {}
        for key in self._sampler.update_keys:
            value = data.get(key, None)
            if value is not None:
                extra[key] = value
        # An extended batch carries "index" over its whole batch shape; batch dims past the
        # storage's ndim repeat the slot of their item: keep one index per item.
        dims = min(self._storage.ndim, index.ndim)
        if index.ndim > dims:
            first = (slice(None),) * dims + (0,) * (index.ndim - dims)
            index = index[first]
            extra = {key: value[first] for key, value in extra.items()}
        anchored = self._anchor_priority(data, priority)  # e.g. Sequence: update the anchors
        if anchored is not None:
            (index, priority), extra = anchored, {}
        with self._lock:
            self._check_writing_process()
            with errors_named(f"data[{self.priority_key!r}]"):  # (the sampler's say "priority")
                self._sampler.update_priority(index, priority, storage=self._storage, **extra)
