"""Where a buffer is served: ``ReplayBuffer(..., service_backend="ray")`` and TorchRL's
:func:`service_backend` / :func:`transport_backend` context managers.

``service_backend="direct"`` (the default) builds the buffer in this process. Any other name
asks a *service backend* to build the buffer somewhere else and return its handle instead, e.g.
``"ray"``: a :class:`~tdreplay.distributed.RayReplayBuffer` serving the same buffer class with
the same arguments from a Ray actor. Core knows no backend but ``"direct"``: packages register
theirs under the Python entry-point group :data:`ENTRY_POINT_GROUP` (``tdreplay-distributed``
registers ``"ray"``), loaded the first time a backend is asked for, or at run time with
:func:`register_service_backend`. A backend that is not installed raises an ``ImportError``
naming the ``pip install`` line.

``transport`` (TorchRL's ``transport=`` / :func:`transport_backend`) names how the data of a
served buffer travels; a direct buffer has none (``"auto"`` / ``"direct"`` only), each backend
checks the transports it knows.

Both context managers set the default of the buffers built within them, in this process only
(a forked child does not inherit them); explicit arguments win.

Examples
--------
>>> from tdreplay.core import ListStorage, ReplayBuffer
>>> with service_backend("direct"):
...     rb = ReplayBuffer(storage=ListStorage(4))
>>> rb.service_backend
'direct'
>>> ReplayBuffer(storage=ListStorage(4), transport="distributed")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
ValueError: A direct ReplayBuffer only supports transport='auto' or 'direct'...
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import warnings
from collections.abc import Callable, Iterator
from importlib import metadata
from typing import Any, TypeVar

from .utils import check_flag

__all__ = ["ENTRY_POINT_GROUP", "ServiceDispatch", "ServiceFactory", "register_service_backend",
           "service_backend", "service_backend_factory", "transport_backend"]

SelfT = TypeVar("SelfT", bound="ServiceBackendMixin")

#: Entry-point group where packages register service backends: ``name = "module:factory"``.
ENTRY_POINT_GROUP = "tdreplay.service_backends"

#: A service backend: ``factory(buffer_cls, options, transport, transport_options, kwargs)``
#: returns the served buffer. ``options``: ``service_backend_options`` (a dict, checked by the
#: backend); ``transport``: the requested transport (``"auto"`` if none); ``kwargs``: the
#: buffer's arguments.
ServiceFactory = Callable[[type, dict[str, Any], str, dict[str, Any], dict[str, Any]], Any]

#: backends known to tdreplay's packages, for the message when one is not installed
_PROVIDERS = {"ray": ("tdreplay-distributed", 'pip install "tdreplay[distributed]"')}
#: TorchRL's transports
_TRANSPORTS = frozenset({"auto", "direct", "thread", "queue", "process", "shared_memory", "ray",
                         "monarch", "distributed"})

_registry: dict[str, ServiceFactory] = {}
_service: contextvars.ContextVar[tuple[int, str] | None] = contextvars.ContextVar(
    "tdreplay_service_backend", default=None)
_transport: contextvars.ContextVar[tuple[int, str] | None] = contextvars.ContextVar(
    "tdreplay_transport_backend", default=None)
_dispatching: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "tdreplay_service_dispatching", default=None)


def _check_name(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise TypeError(f"{name} must be a non-empty str, got {value!r}.")
    return value


def register_service_backend(name: str, factory: ServiceFactory) -> None:
    """Serve buffers built with ``service_backend=name`` through ``factory`` (see
    :data:`ServiceFactory`); replaces a backend of that name. Packages register theirs through
    the entry-point group :data:`ENTRY_POINT_GROUP` instead.

    Examples
    --------
    >>> from tdreplay.core import ListStorage, ReplayBuffer
    >>> def local(buffer_cls, options, transport, transport_options, kwargs):
    ...     return buffer_cls(**kwargs)  # a backend that builds the buffer here
    >>> register_service_backend("doc-local", local)
    >>> rb = ReplayBuffer(storage=ListStorage(4), service_backend="doc-local")
    >>> type(rb).__name__, rb.service_backend
    ('ReplayBuffer', 'direct')
    """
    _check_name(name, "name")
    if name == "direct":
        raise ValueError("'direct' is the buffer itself; it cannot be registered.")
    if not callable(factory):
        raise TypeError(f"factory must be callable, got {type(factory).__name__}.")
    _registry[name] = factory


def service_backend_factory(name: str) -> ServiceFactory:
    """The factory of the service backend ``name`` (registered, or found among the entry
    points of :data:`ENTRY_POINT_GROUP`).

    Raises
    ------
    ImportError
        A backend of tdreplay's packages (``"ray"``) that is not installed: the message names
        the ``pip install`` line.
    ValueError
        No installed package provides ``name``.
    """
    _check_name(name, "service_backend")
    factory = _registry.get(name)
    if factory is not None:
        return factory
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if entry.name == name:
            loaded: ServiceFactory = entry.load()
            register_service_backend(name, loaded)  # checks that it is callable
            return loaded
    if name in _PROVIDERS:
        dist, install = _PROVIDERS[name]
        raise ImportError(f"service_backend={name!r} needs {dist}, which is not installed. "
                          f"Install it with: {install}")
    known = sorted({"direct", *_registry, *(e.name for e in
                                            metadata.entry_points(group=ENTRY_POINT_GROUP))})
    raise ValueError(f"Unsupported service backend {name!r}: the installed ones are {known}.")


def _current(var: contextvars.ContextVar[tuple[int, str] | None]) -> str | None:
    value = var.get()
    if value is None or value[0] != os.getpid():  # a forked child does not inherit it
        return None
    return value[1]


def _check_transport(value: Any) -> str:
    _check_name(value, "transport")
    if value not in _TRANSPORTS:
        raise ValueError(f"Unsupported transport backend {value!r}. Expected one of "
                         f"{sorted(_TRANSPORTS)}.")
    return str(value)


@contextlib.contextmanager
def service_backend(backend: str) -> Iterator[None]:
    """Within the block, buffers built without ``service_backend=`` are served by ``backend``
    (TorchRL's ``torchrl.service_backend``); this process only, the previous default restored
    on exit.

    Examples
    --------
    >>> from tdreplay.core import ReplayBuffer
    >>> with service_backend("direct"):
    ...     ReplayBuffer().service_backend
    'direct'
    """
    _check_name(backend, "backend")
    token = _service.set((os.getpid(), backend))
    try:
        yield
    finally:
        _service.reset(token)


@contextlib.contextmanager
def transport_backend(backend: str) -> Iterator[None]:
    """Within the block, served buffers built without ``transport=`` use ``backend``
    (TorchRL's ``torchrl.transport_backend``: ``"auto"``, ``"ray"``, ``"distributed"``, ...);
    each service backend checks that it supports it.

    Examples
    --------
    >>> from tdreplay.core import ReplayBuffer
    >>> with service_backend("direct"), transport_backend("direct"):
    ...     ReplayBuffer().service_backend
    'direct'
    """
    token = _transport.set((os.getpid(), _check_transport(backend)))
    try:
        yield
    finally:
        _transport.reset(token)


class ServiceDispatch(type):
    """Metaclass of :class:`~tdreplay.core.ReplayBuffer`: takes ``service_backend``,
    ``service_backend_options``, ``transport`` and ``transport_options`` out of the arguments
    and builds the buffer here (``"direct"``) or through its service backend.
    ``use_ray_service=True`` is TorchRL's older spelling of ``service_backend="ray"`` (a
    ``FutureWarning``, as TorchRL's, which drops it in 0.16)."""

    def __call__(cls, *args: Any, service_backend: str | None = None,
                 service_backend_options: dict[str, Any] | None = None,
                 transport: str | None = None, transport_options: dict[str, Any] | None = None,
                 use_ray_service: bool = False, **kwargs: Any) -> Any:
        if check_flag(use_ray_service, "use_ray_service"):
            if service_backend not in (None, "ray"):
                raise ValueError(f"use_ray_service=True conflicts with "
                                 f"service_backend={service_backend!r}.")
            warnings.warn("use_ray_service is deprecated (as in TorchRL, which removes it in "
                          "0.16): use service_backend='ray' instead.", FutureWarning,
                          stacklevel=2)
            service_backend = "ray"
        from_context = service_backend is None and _current(_service) is not None
        if service_backend is None:
            # a backend building its buffer in this process builds a direct one
            nested = _dispatching.get() == os.getpid()
            service_backend = "direct" if nested else (_current(_service) or "direct")
        _check_name(service_backend, "service_backend")
        transport_from_context = transport is None and _current(_transport) is not None
        if transport is None:
            transport = _current(_transport) or "auto"
        transport = _check_transport(transport)
        options = dict(service_backend_options or {})
        if service_backend == "direct":
            if transport not in ("auto", "direct"):
                where = (" (selected by an enclosing transport_backend context)"
                         if transport_from_context else "")
                raise ValueError(f"A direct ReplayBuffer only supports transport='auto' or "
                                 f"'direct', got transport={transport!r}{where}.")
            if transport_options:
                raise ValueError("transport_options are only valid for a served buffer "
                                 "(service_backend other than 'direct').")
            if options:
                raise ValueError("service_backend_options are only valid for a served buffer "
                                 "(service_backend other than 'direct').")
            return super().__call__(*args, **kwargs)
        if args:
            raise TypeError(f"{cls.__name__} takes keyword arguments only.")
        factory = service_backend_factory(service_backend)
        token = _dispatching.set(os.getpid())
        try:
            return factory(cls, options, transport, dict(transport_options or {}), kwargs)
        except ValueError as err:
            if from_context:
                raise ValueError(f"{err} (service_backend={service_backend!r} was selected by "
                                 "an enclosing service_backend context)") from err
            raise
        finally:
            _dispatching.reset(token)


class ServiceBackendMixin:
    """``service_backend`` and the lifecycle of a direct buffer as a service (TorchRL's
    ``client`` / ``start`` / ``is_alive`` / ``shutdown``), mixed into
    :class:`~tdreplay.core.ReplayBuffer`.

    Examples
    --------
    >>> from tdreplay.core import ListStorage, ReplayBuffer
    >>> rb = ReplayBuffer(storage=ListStorage(4), service_backend="direct")
    >>> rb.client() is rb, rb.start() is rb, rb.service_backend, rb.is_alive
    (True, True, 'direct', True)
    >>> rb.shutdown()
    >>> rb.is_alive
    False
    """

    _shut_down: bool = False

    @property
    def service_backend(self) -> str:
        """Where the buffer is served: ``"direct"`` (this process) for a buffer built here;
        a served buffer (e.g. ``RayReplayBuffer``) names its backend."""
        return "direct"

    def client(self: SelfT) -> SelfT:
        """What other code of this process uses to reach the buffer: the buffer itself."""
        return self

    def start(self: SelfT) -> SelfT:
        """The buffer (a direct buffer runs from construction); ``RuntimeError`` once
        :meth:`shutdown` was called."""
        if self._shut_down:
            raise RuntimeError("A shut down replay buffer cannot be restarted.")
        return self

    @property
    def is_alive(self) -> bool:
        """False once :meth:`shutdown` was called."""
        return not self._shut_down

    def shutdown(self, timeout: float | None = None) -> None:
        """Mark the buffer as shut down (:attr:`is_alive` False; its data stays readable).
        ``timeout`` is TorchRL's, unused by a direct buffer."""
        self._shut_down = True
