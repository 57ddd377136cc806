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

How a waiting buffer builds its parts: while they wait, the buffer's class is a *waiting
variant* of its class (:func:`waiting_class`: the same name, with the part attributes as
descriptors that build the parts when read), and once they are built it is its own class
again. CPython 3.11 reads an instance attribute fast only when its class has no attribute of
that name, even a non-data descriptor, and only while the instance's ``__dict__`` was never
read as such: so a built buffer carries neither, and this module never touches
``self.__dict__``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar, cast

import torch

from .buffer_consume import consuming_sampler
from .sampler import RandomSampler, Sampler
from .storage import ListStorage, Storage, StorageCheckpointerBase
from .transform import Compose, as_transform
from .utils import check_flag, check_instance
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
    delayed = check_flag(delayed_init, "delayed_init", allow_none=True)
    return transform_factory is not None if delayed is None else delayed


class _BuiltOnFirstRead:
    """A part attribute of a waiting buffer (``_storage``, ...): reading it builds the parts
    (a non-data descriptor of the waiting class only, see the module)."""

    def __init__(self, name: str, read: Callable[[Any, str], Any]) -> None:
        self._name, self._read = name, read

    def __get__(self, buffer: Any, owner: type | None = None) -> Any:
        if buffer is None:
            return self
        return self._read(buffer, self._name)


_WAITING: dict[type, type[PartsMixin]] = {}  # buffer class -> its waiting variant


def _new_buffer(cls: Any) -> Any:
    """A bare instance of ``cls`` (what unpickling fills with ``__setstate__``)."""
    return cls.__new__(cls)


def _reduce_as_built(buffer: Any, protocol: int) -> tuple[Any, ...]:
    """Pickle a waiting buffer as an instance of its own class (its ``__setstate__`` makes the
    copy wait again)."""
    return (_new_buffer, (cast(Any, type(buffer)).waits_as,), buffer.__getstate__())


def waiting_class(cls: type[PartsMixin]) -> type[PartsMixin]:
    """The class a buffer of class ``cls`` has while its parts wait for its first use: a
    subclass with the same name whose part attributes build the parts when read.

    Examples
    --------
    >>> from tdreplay.core import ReplayBuffer
    >>> waiting = waiting_class(ReplayBuffer)
    >>> waiting.__name__, waiting.waits_as is ReplayBuffer, waiting_class(waiting) is waiting
    ('ReplayBuffer', True, True)
    """
    if "waits_as" in cls.__dict__:
        return cls
    with _BUILDING:
        variant = _WAITING.get(cls)
        if variant is None:
            namespace: dict[str, Any] = {name: _BuiltOnFirstRead(name, cls._part_after_build)
                                         for name in _PART_ATTRS}
            namespace.update(__module__=cls.__module__, __qualname__=cls.__qualname__,
                             __doc__=cls.__doc__, waits_as=cls,
                             __reduce_ex__=_reduce_as_built)
            metaclass: Any = type(cls)  # (the buffer's: ServiceDispatch)
            variant = metaclass(cls.__name__, (cls,), namespace)
            _WAITING[cls] = variant
    return variant


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

    #: the arguments of :meth:`_build_parts` of a buffer whose parts wait (``None``: built)
    _pending_parts: dict[str, Any] | None = None

    @property
    def initialized(self) -> bool:
        """Whether the storage, sampler, writer and transform are built (``False`` only for a
        buffer with ``delayed_init`` not used yet)."""
        return self._pending_parts is None

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
        storage = (self._pending_parts or {}).get("storage")
        if isinstance(storage, Storage):
            out.update(capacity=int(storage.max_size), utilization=0.0)
        return out

    def _init_parts(self, delayed: bool, **parts: Any) -> None:
        """Build the parts from ``parts`` (the arguments of :meth:`_build_parts`), or keep them
        for the first use when ``delayed``."""
        if delayed:
            self._wait_for_first_use(parts)
        else:
            self._build_parts(**parts)

    def _wait_for_first_use(self, parts: dict[str, Any]) -> None:
        """Keep ``parts`` for the first use: the buffer takes its waiting class (see the
        module)."""
        self._pending_parts = parts
        self.__class__ = waiting_class(type(self))

    def _build_pending(self) -> None:
        """Build the parts of a buffer that waited for its first use (nothing if it has them),
        then give it back its own class. A build that fails leaves the buffer waiting, as it
        was, and raises."""
        with _BUILDING:
            parts = self._pending_parts
            if parts is None:
                return
            self._pending_parts = None
            try:
                self._build_parts(**parts)
            except BaseException:
                for name in _PART_ATTRS:
                    try:
                        delattr(self, name)  # (the instance's: the descriptor stays)
                    except AttributeError:
                        pass
                self._pending_parts = parts
                raise
            self.__class__ = cast(Any, type(self)).waits_as

    def _build_parts(self, *, storage: Any, sampler: Any, writer: Any, transform: Any,
                     transform_factory: Callable[[], Any] | None, collate_fn: Any,
                     consume_after_n_samples: int | None, compilable: bool,
                     checkpointer: StorageCheckpointerBase[Any] | None = None) -> None:
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
        if checkpointer is not None:  # (TorchRL's ``ReplayBuffer(checkpointer=...)``)
            built_storage.checkpointer = checkpointer
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
        (what :class:`_BuiltOnFirstRead` calls). A part read while they are being built (not
        set yet) is missing: ``AttributeError``."""
        self._build_pending()
        if "waits_as" in type(self).__dict__:  # (still waiting: being built, or failed)
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(self, name)
