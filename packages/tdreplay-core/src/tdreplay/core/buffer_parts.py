"""Building a buffer's parts, at construction or on first use (TorchRL's ``delayed_init``).

:class:`PartsMixin` is one of the rooms :class:`~tdreplay.core.ReplayBuffer` is built from. It
turns the ``storage`` / ``sampler`` / ``writer`` arguments (instances or factories, such as
``partial(ListStorage)``), the ``transform`` or ``transform_factory`` and the ``collate_fn``
into the buffer's parts. With ``delayed_init=True`` (the default when a ``transform_factory``
is given, as TorchRL's) nothing is built at construction: the arguments wait, picklable, and
the first use of the buffer (``extend``, ``sample``, ``len``, ``rb.storage``, ...) builds the
parts. Until then ``rb.initialized`` is ``False`` and ``rb.stats()`` reports an empty buffer
without building anything; a buffer pickled before its first use (sent to a worker) builds
its own parts where it is used.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from .buffer_consume import consuming_sampler
from .sampler import RandomSampler, Sampler
from .storage import ListStorage, Storage
from .transform import Compose, as_transform
from .utils import check_instance
from .writer import RoundRobinWriter, Writer

T = TypeVar("T")

#: the attributes a buffer's parts live in; reading one of a buffer still waiting for its first
#: use builds the parts
_PART_ATTRS = frozenset({"_storage", "_sampler", "_writer", "_transform", "_collate_fn"})
#: held while a buffer builds its parts (once per buffer): a second thread using the buffer at
#: the same moment waits for them instead of seeing a buffer without parts
_BUILDING = threading.RLock()


def component(value: Any, kind: type[T], default: Callable[[], Any]) -> T:
    """``value``, or what it returns when it is a factory (TorchRL passes
    ``storage=partial(ListStorage)``), or ``default()`` when ``None``; checked to be a ``kind``
    (the error names the argument: ``storage``, ``sampler``, ``writer``)."""
    if value is None:
        value = default()
    elif not isinstance(value, kind) and callable(value):
        value = value()
    return check_instance(value, kind, kind.__name__.lower())


def check_transform_args(transform: Any, transform_factory: Any) -> None:
    """``TypeError`` when both ``transform`` and ``transform_factory`` are given, or when the
    factory cannot be called (checked at construction, even when the parts wait)."""
    if transform_factory is None:
        return
    if transform is not None:
        raise TypeError("transform and transform_factory are mutually exclusive: pass one.")
    if not callable(transform_factory):
        raise TypeError(f"transform_factory must be callable, got "
                        f"{type(transform_factory).__name__}.")


def delays_init(delayed_init: bool | None, transform_factory: Any) -> bool:
    """Whether a buffer waits for its first use to build its parts: ``delayed_init`` when
    given, else whether a ``transform_factory`` is (TorchRL's default)."""
    if delayed_init is not None:
        return check_instance(delayed_init, bool, "delayed_init")
    return transform_factory is not None


class _BuiltOnFirstRead:
    """A part attribute of a buffer (``_storage``, ...) read while its parts wait for the first
    use: reading it builds them. A non-data descriptor, so a built part, in the instance's
    ``__dict__``, is found first and this is never called again (a ``__getattr__`` instead
    would send every attribute read of every buffer through the slow generic lookup)."""

    def __init__(self, read: Callable[[Any, str], Any]) -> None:
        self._read, self._name = read, ""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    def __get__(self, buffer: Any, owner: type | None = None) -> Any:
        if buffer is None:
            return self
        return self._read(buffer, self._name)


class PartsMixin:
    """The parts of a buffer, built now or on first use (mixed into
    :class:`~tdreplay.core.ReplayBuffer`).

    Examples
    --------
    >>> from functools import partial
    >>> from tdreplay.core import ListStorage, ReplayBuffer
    >>> rb = ReplayBuffer(storage=partial(ListStorage, 10), delayed_init=True)
    >>> rb.initialized, rb.stats()["size"]
    (False, 0)
    >>> _ = rb.extend([1, 2, 3])  # the first use builds the storage, sampler and writer
    >>> rb.initialized, len(rb), rb.storage.max_size
    (True, 3, 10)
    """

    _storage: Storage
    _sampler: Sampler
    _writer: Writer
    _transform: Compose
    _collate_fn: Callable[[Any], Any]
    _rng: torch.Generator | None
    shared: bool

    if TYPE_CHECKING:  # what the buffer this is mixed into provides
        def _check_sampler_batch_size(self, sampler: Sampler) -> None: ...

        def _check_parts(self, storage: Storage, sampler: Sampler, writer: Writer) -> None: ...

        def share(self, shared: bool = True) -> Any: ...

        def _read_storage(self, storage: Storage) -> None: ...

    @property
    def initialized(self) -> bool:
        """Whether the storage, sampler, writer and transform are built (``False`` only for a
        buffer with ``delayed_init`` not used yet)."""
        return "_pending_parts" not in self.__dict__

    def pending_stats(self) -> dict[str, int | float | bool]:
        """What ``stats()`` reports for a buffer whose parts wait for its first use, without
        building them (as TorchRL's): an empty buffer, and the capacity of the storage when it
        was given one rather than a factory.

        Examples
        --------
        >>> from tdreplay.core import ListStorage, ReplayBuffer
        >>> ReplayBuffer(storage=ListStorage(10), delayed_init=True).stats()
        ... # doctest: +NORMALIZE_WHITESPACE
        {'size': 0, 'write_count': 0, 'prefetch_queue_size': 0, 'initialized': False,
         'capacity': 10, 'utilization': 0.0}
        """
        out: dict[str, int | float | bool] = {"size": 0, "write_count": 0,
                                              "prefetch_queue_size": 0, "initialized": False}
        storage = self.__dict__.get("_pending_parts", {}).get("storage")
        if isinstance(storage, Storage):
            out.update(capacity=int(storage.max_size), utilization=0.0)
        return out

    def _init_parts(self, delayed: bool, **parts: Any) -> None:
        """Build the parts from ``parts`` (the arguments of :meth:`_build_parts`), or keep them
        for the first use when ``delayed``."""
        if delayed:
            self.__dict__["_pending_parts"] = parts
        else:
            self._build_parts(**parts)

    def _build_pending(self) -> None:
        """Build the parts of a buffer that waited for its first use (nothing if it has them).
        A build that fails leaves the buffer waiting, as it was, and raises."""
        with _BUILDING:
            parts = self.__dict__.pop("_pending_parts", None)
            if parts is None:
                return
            try:
                self._build_parts(**parts)
            except BaseException:
                for name in _PART_ATTRS:
                    self.__dict__.pop(name, None)
                self.__dict__["_pending_parts"] = parts
                raise

    def _build_parts(self, *, storage: Any, sampler: Any, writer: Any, transform: Any,
                     transform_factory: Callable[[], Any] | None, collate_fn: Any,
                     consume_after_n_samples: int | None, compilable: bool) -> None:
        """Build and check the parts, then install them (none installed if a check fails)."""
        built_storage = component(storage, Storage,  # TorchRL's default: ListStorage(1000)
                                  partial(ListStorage, 1000, compilable=compilable))
        built_sampler = consuming_sampler(component(sampler, Sampler, RandomSampler),
                                          consume_after_n_samples)
        built_writer = component(writer, Writer, partial(RoundRobinWriter, compilable=compilable))
        if transform_factory is not None:
            transform = transform_factory()
        self._check_sampler_batch_size(built_sampler)
        self._check_parts(built_storage, built_sampler, built_writer)  # (buffer_consume)
        composed = Compose()
        if isinstance(transform, Compose):
            composed = transform
        elif transform is not None:
            composed.append(as_transform(transform))
        built_writer.register_storage(built_storage)
        self._storage, self._sampler, self._writer = built_storage, built_sampler, built_writer
        self._read_storage(built_storage)  # (buffer_readers)
        self._collate_fn = collate_fn if collate_fn is not None else built_storage.default_collate
        self._transform = composed
        if self._rng is not None:
            built_sampler.set_rng(self._rng)
        if self.shared:
            self.share(True)

    def _part_after_build(self, name: str) -> Any:
        """The part ``name`` of a buffer read before its first use: the parts are built first
        (what :class:`_BuiltOnFirstRead` calls)."""
        self._build_pending()
        parts = self.__dict__
        if name in parts:
            return parts[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    if not TYPE_CHECKING:  # (to mypy they are the annotated parts above)
        _storage = _BuiltOnFirstRead(_part_after_build)
        _sampler = _BuiltOnFirstRead(_part_after_build)
        _writer = _BuiltOnFirstRead(_part_after_build)
        _transform = _BuiltOnFirstRead(_part_after_build)
        _collate_fn = _BuiltOnFirstRead(_part_after_build)
