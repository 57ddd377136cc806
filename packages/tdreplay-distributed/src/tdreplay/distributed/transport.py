"""The ``"distributed"`` transport: a buffer client whose data travels over ``torch.distributed``.

TorchRL's ``transport="distributed"`` (``ReplayBuffer(..., service_backend="ray",
transport="distributed", transport_options={"backend": "gloo", "timeout": 30.0})``): the
buffer lives in a Ray actor as with the ``"ray"`` transport, and ``rb.client()`` returns a
:class:`DistributedBufferClient`, which opens a gloo channel of its own to the actor on its
first call (Ray carries only that handshake) and moves TensorDicts over it as raw tensor bytes
(see :mod:`._channel`). As TorchRL's client, it offers ``extend``, ``sample``,
``update_tensordict_priority``, ``len``, ``write_count`` and ``batch_size``, with a
``timeout`` per call; the layout of ``extend`` (keys, dtypes, shapes, batch size) and the batch
size of ``sample`` are fixed by a client's first call of each. It has no lifecycle
(``close`` / ``shutdown``): the buffer that created the actor keeps it.

Only the ``"gloo"`` backend is offered (CPU tensors; NCCL needs one GPU per process, which this
project cannot test).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from tdreplay.core.utils import ensure_update_tensordict

from ._channel import ERROR, Channel, ChannelClosedError, describe, error_of, tensordict_of

__all__ = ["TRANSPORTS", "DistributedBufferClient", "TransportMixin", "check_transport"]

#: the transports of a served buffer: Ray's object store, or torch.distributed channels
TRANSPORTS = ("auto", "ray", "distributed")


def check_transport(transport: Any, options: Any) -> tuple[str, dict[str, Any]]:
    """``(transport, options)`` checked: ``"auto"`` is ``"ray"``; the ``"distributed"``
    transport takes ``backend`` (``"gloo"``) and ``timeout`` (seconds), ``"ray"`` none.

    Examples
    --------
    >>> check_transport("distributed", {"timeout": 30})
    ('distributed', {'backend': 'gloo', 'timeout': 30.0})
    >>> check_transport("auto", None)
    ('ray', {})
    """
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {list(TRANSPORTS)}, got {transport!r}.")
    options = {} if options is None else options
    if not isinstance(options, dict):
        raise TypeError(f"transport_options must be a dict, got {type(options).__name__}.")
    if transport != "distributed":
        if options:
            raise ValueError(f"the 'ray' transport takes no transport_options, got "
                             f"{sorted(options)}.")
        return "ray", {}
    unknown = sorted(set(options) - {"backend", "timeout"})
    if unknown:
        raise TypeError(f"unexpected transport_options {unknown} (accepted: backend, timeout).")
    backend = options.get("backend", "gloo")
    if backend != "gloo":
        raise ValueError(f"transport_options backend must be 'gloo' (CPU tensors), got "
                         f"{backend!r}.")
    timeout = options.get("timeout", 300.0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"transport_options timeout must be a positive number of seconds, "
                         f"got {timeout!r}.")
    return "distributed", {"backend": backend, "timeout": float(timeout)}


class TransportMixin:
    """How a served buffer's client handles move data (mixed into
    :class:`~tdreplay.distributed.RayReplayBuffer`): ``transport_kind``, ``transport_options``
    and the handshake of a ``"distributed"`` client, :meth:`open_channel`."""

    _client: Any  # the buffer's ActorClient
    # a buffer attached or made from a client: Ray's object store
    _transport = "ray"
    _transport_options: Mapping[str, Any] = {}

    @property
    def transport_kind(self) -> str:
        """How :meth:`client` handles move data (TorchRL's ``transport_kind``): ``"ray"``
        or ``"distributed"``."""
        return self._transport

    @property
    def transport_options(self) -> dict[str, Any]:
        """The options of the ``"distributed"`` transport (``{}`` for ``"ray"``)."""
        return dict(self._transport_options)

    def _handle_on(self, copy: Any) -> Any:
        """:meth:`client`'s handle: over a channel of its own for ``"distributed"``, else the
        default (through Ray)."""
        if self._transport == "distributed":
            return DistributedBufferClient(copy, timeout=self._transport_options["timeout"])
        return super()._handle_on(copy)  # type: ignore[misc]

    def open_channel(self, timeout: float = 300.0) -> dict[str, Any]:
        """Open a ``"distributed"`` transport channel to the actor: where a client joins it
        (``host``, ``port``, ``prefix``), within ``timeout`` s; what
        :class:`~tdreplay.distributed.DistributedBufferClient` does first.

        Examples
        --------
        >>> from functools import partial
        >>> from tdreplay.core import ListStorage
        >>> from tdreplay.distributed import RayReplayBuffer
        >>> rb = RayReplayBuffer(storage=partial(ListStorage, 8))
        >>> sorted(rb.open_channel(10.0))
        ['host', 'port', 'prefix']
        >>> rb.close()
        """
        where: dict[str, Any] = self._client.call("open_channel", float(timeout))
        return where


class DistributedBufferClient:
    """A client of a served buffer over a ``torch.distributed`` channel of its own.

    Made by ``rb.client()`` of a :class:`~tdreplay.distributed.RayReplayBuffer` built with
    ``transport="distributed"`` (see the module docstring). It pickles (to a Ray task or actor,
    or another process), and the copy opens its own channel at its first call.

    Parameters
    ----------
    buffer : RayReplayBuffer
        The served buffer (a copy of its handle): the handshake goes through it.
    timeout : float
        Seconds a call (and the channel's handshake) may take by default.

    Examples
    --------
    >>> from functools import partial
    >>> import torch
    >>> from tensordict import TensorDict
    >>> from tdreplay.core import ReplayBuffer
    >>> from tdreplay.storages import LazyTensorStorage
    >>> rb = ReplayBuffer(storage=partial(LazyTensorStorage, 100), batch_size=4,
    ...                   service_backend="ray", transport="distributed",
    ...                   transport_options={"timeout": 30.0},
    ...                   service_backend_options={"ray_init_config": {"num_cpus": 1}})
    >>> client = rb.client()
    >>> client.extend(TensorDict({"x": torch.arange(8)}, [8])).tolist()
    [0, 1, 2, 3, 4, 5, 6, 7]
    >>> len(client), client.write_count, client.sample()["x"].shape
    (8, 8, torch.Size([4]))
    >>> rb.close()
    """

    def __init__(self, buffer: Any, *, timeout: float = 300.0) -> None:
        self._buffer = buffer
        self._timeout = float(timeout)
        self._lock = threading.Lock()
        self._channel: Channel | None = None
        self._pid = os.getpid()
        #: (entries without their tensors, batch size) of the first extend: later ones match it
        self._extend_layout: Any = None
        #: the batch size of the first sample: later ones ask for it
        self._sample_size: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"buffer": self._buffer, "timeout": self._timeout}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["buffer"], timeout=state["timeout"])  # type: ignore[misc]

    # ---- what the client knows -----------------------------------------------------------------
    @property
    def batch_size(self) -> int | None:
        """The served buffer's default batch size."""
        batch_size: int | None = self._buffer.batch_size
        return batch_size

    @property
    def write_count(self) -> int:
        """Items ever written to the served buffer."""
        return int(self.stats()["write_count"])

    def __len__(self) -> int:
        return int(self.stats()["size"])

    def stats(self, *, timeout: float | None = None) -> dict[str, Any]:
        """The served buffer's :meth:`~tdreplay.core.ReplayBuffer.stats`."""
        reply, _ = self._request({"op": "stats"}, [], timeout)
        stats: dict[str, Any] = reply["stats"]
        return stats

    # ---- data ----------------------------------------------------------------------------------
    def extend(self, data: TensorDictBase, *, timeout: float | None = None) -> torch.Tensor:
        """Write the TensorDict ``data``; returns the slots written. Its keys, dtypes, shapes
        and batch size must be those of this client's first ``extend`` (``ValueError``
        otherwise, nothing sent)."""
        if not isinstance(data, TensorDictBase):
            raise TypeError(f"the distributed transport extends with TensorDicts, got "
                            f"{type(data).__name__}.")
        entries, leaves = describe(data)
        layout = (entries, list(data.batch_size))
        if self._extend_layout is not None and layout != self._extend_layout:
            raise ValueError(
                "the distributed transport has a fixed extend layout (as TorchRL's): this "
                f"client's first extend had {_layout_text(self._extend_layout)}, this one "
                f"{_layout_text(layout)}.")
        _, tensors = self._request({"op": "extend", "entries": entries,
                                    "batch_size": list(data.batch_size)}, leaves, timeout)
        self._extend_layout = layout
        return tensors[0]

    def add(self, data: TensorDictBase, *, timeout: float | None = None) -> int:
        """Write one item (a TensorDict without batch dims): :meth:`extend` of it as a batch
        of one, as TorchRL's client; returns its slot. The layout rule of :meth:`extend`
        holds: a client that adds writes batches of one."""
        if not isinstance(data, TensorDictBase):
            raise TypeError(f"the distributed transport adds TensorDicts, got "
                            f"{type(data).__name__}.")
        return int(self.extend(data.unsqueeze(0), timeout=timeout).reshape(-1)[0])

    @property
    def dim_extend(self) -> int:
        """The served buffer's ``dim_extend`` (read and set through its Ray handle)."""
        return int(self._buffer.dim_extend)

    @dim_extend.setter
    def dim_extend(self, value: int) -> None:
        self._buffer.dim_extend = value

    def sample(self, batch_size: int | None = None, *, timeout: float | None = None
               ) -> TensorDict:
        """A batch of ``batch_size`` (default: the buffer's), the size of this client's first
        sample (``ValueError`` otherwise)."""
        if batch_size is None:
            batch_size = self.batch_size
        if batch_size is None:
            raise RuntimeError("A sample batch size must be provided (the served buffer has "
                               "no default batch_size).")
        if self._sample_size is not None and batch_size != self._sample_size:
            raise ValueError("The distributed replay transport has a fixed sample layout: "
                             f"expected {self._sample_size}, got {batch_size}.")
        reply, tensors = self._request({"op": "sample", "batch_size": int(batch_size)}, [],
                                       timeout)
        self._sample_size = int(batch_size)
        return tensordict_of(reply["entries"], tensors, reply["batch_size"])

    def update_tensordict_priority(self, data: TensorDictBase, *,
                                   timeout: float | None = None) -> None:
        """The served buffer's ``update_tensordict_priority(data)``; only ``index``, the
        priority entry and ``write_generation`` travel."""
        data = ensure_update_tensordict(data)
        keys = [k for k in ("index", self._buffer.priority_key, "write_generation")
                if k is not None and k in data.keys()]
        part = data.select(*keys)
        entries, leaves = describe(part)
        self._request({"op": "priority", "entries": entries,
                       "batch_size": list(part.batch_size)}, leaves, timeout)

    def disconnect(self) -> None:
        """Close this client's channel (the next call opens a new one)."""
        with self._lock:
            channel, self._channel = self._channel, None
            if channel is not None:
                try:
                    channel.send({"op": "close"})
                except ChannelClosedError:
                    pass

    def reconnect(self) -> None:
        """Find the served buffer's actor again by name, after the client that created it
        respawned it (``BufferActorDiedError`` says so): this client's channel to the old actor
        is dropped, and the next call opens one to the new actor."""
        with self._lock:
            self._channel = None  # (the old actor is gone: nothing to tell it)
            self._buffer.reconnect()

    # ---- the channel ---------------------------------------------------------------------------
    def _connected(self, timeout: float) -> Channel:
        if self._channel is not None and self._pid == os.getpid():
            return self._channel
        self._channel = Channel.connect(self._buffer.open_channel(timeout), timeout)
        self._pid = os.getpid()
        return self._channel

    def _request(self, request: dict[str, Any], tensors: list[torch.Tensor],
                 timeout: float | None) -> tuple[dict[str, Any], list[torch.Tensor]]:
        seconds = self._timeout if timeout is None else float(timeout)
        with self._lock:
            channel = self._connected(seconds)
            channel.timeout = seconds
            try:
                channel.send(request, tensors)
                reply, received, kind = channel.receive()
            except ChannelClosedError:
                self._channel = None  # the next call opens a new channel
                raise
        if kind == ERROR:
            raise error_of(reply)
        return reply, received

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._buffer!r})"


def _layout_text(layout: Any) -> str:
    entries, batch_size = layout
    keys = ", ".join(f"{'.'.join(path)}: {dtype}{shape}" for path, dtype, shape in entries)
    return f"batch size {batch_size} and entries {{{keys}}}"
