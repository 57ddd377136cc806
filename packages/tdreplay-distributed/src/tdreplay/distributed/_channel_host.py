"""The actor's side of the ``"distributed"`` transport: one thread per client channel.

:class:`ChannelHost` lives in a buffer actor (:class:`~._server.BufferServer` makes it on the
first ``open_channel`` call). It runs the rendezvous store on the actor's node and, for each
client, a thread that joins the client's channel (:class:`~._channel.Channel`, rank 0) and
answers its requests with the actor's buffer, which is thread-safe: ``extend`` (a TensorDict
described by its leaves), ``sample``, ``update_tensordict_priority`` and ``stats``. An error
the buffer raises goes back to the client as a reply (the buffer is left as it was, as for any
call); a channel whose client left or went silent past the timeout ends its thread.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
from tensordict import TensorDictBase, is_tensor_collection

from tdreplay.core import ReplayBuffer, TensorDictReplayBuffer

from ._channel import Channel, ChannelClosedError, describe, tensordict_of

__all__ = ["IDLE_WAIT", "ChannelHost", "serve_request"]

#: how long a channel waits for its client's next request (a client may sample rarely; one
#: that dies closes its connection, which ends the wait at once)
IDLE_WAIT = 365 * 24 * 3600.0


def serve_request(buffer: ReplayBuffer, request: dict[str, Any], tensors: list[torch.Tensor]
                  ) -> tuple[dict[str, Any], list[torch.Tensor]]:
    """The reply of ``buffer`` to one request of a client channel."""
    op = request.get("op")
    if op == "extend":
        slots = buffer.extend(tensordict_of(request["entries"], tensors, request["batch_size"]))
        return {}, [slots]
    if op == "sample":
        data = buffer.sample(int(request["batch_size"]))
        if not is_tensor_collection(data) or not isinstance(data, TensorDictBase):
            raise TypeError("the distributed transport carries TensorDicts: this buffer's "
                            f"samples are {type(data).__name__}s.")
        entries, leaves = describe(data)
        return {"entries": entries, "batch_size": list(data.batch_size)}, leaves
    if op == "priority":
        if not isinstance(buffer, TensorDictReplayBuffer):
            raise TypeError(f"update_tensordict_priority needs a TensorDict buffer; this one is "
                            f"a {type(buffer).__name__} (use update_priority).")
        buffer.update_tensordict_priority(
            tensordict_of(request["entries"], tensors, request["batch_size"]))
        return {}, []
    if op == "stats":
        return {"stats": buffer.stats()}, []
    raise ValueError(f"unknown request {op!r}")


class ChannelHost:
    """Client channels of one buffer actor (see the module docstring)."""

    def __init__(self, buffer: Callable[[], ReplayBuffer], host: str) -> None:
        self._buffer = buffer
        self._host = host
        self._store: Any = None
        self._numbers = itertools.count()
        self._lock = threading.Lock()

    def open(self, timeout: float) -> dict[str, Any]:
        """Start a channel thread; returns where the client joins it (``host``, ``port``,
        ``prefix``), within ``timeout`` s."""
        from torch.distributed import PrefixStore, TCPStore

        with self._lock:
            if self._store is None:
                self._store = TCPStore(self._host, 0, None, True, timedelta(seconds=timeout),
                                       wait_for_workers=False)
            prefix = f"tdreplay-channel-{next(self._numbers)}"
            store = PrefixStore(prefix, self._store)
        threading.Thread(target=self._serve, args=(store, timeout), daemon=True,
                         name=prefix).start()
        return {"host": self._host, "port": int(self._store.port), "prefix": prefix}

    def _serve(self, store: Any, timeout: float) -> None:
        try:
            channel = Channel.join(store, rank=0, timeout=timeout)
        except RuntimeError:
            return  # the client never came
        while True:
            try:
                request, tensors, _ = channel.receive(first_wait=IDLE_WAIT)
            except Exception:  # noqa: BLE001 - the client left, or sent no request: the
                return  # channel is out of step, so it ends (the client's next call reopens)
            if request.get("op") == "close":
                return
            try:
                reply, leaves = serve_request(self._buffer(), request, tensors)
            except Exception as err:  # noqa: BLE001 - the client re-raises it
                try:
                    channel.send_error(err)
                except ChannelClosedError:
                    return
                continue
            try:
                channel.send(reply, leaves)
            except ChannelClosedError:
                return
