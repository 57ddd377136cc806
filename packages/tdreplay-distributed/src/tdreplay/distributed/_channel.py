"""A point-to-point channel over ``torch.distributed`` (gloo) between a buffer actor and a
client: the ``"distributed"`` transport (:mod:`.transport`).

Each client gets a process group of its own with the actor (rank 0 the actor, rank 1 the
client; a ``TCPStore`` on the actor's node for the rendezvous, one ``PrefixStore`` per
channel), so channels never wait on each other. A message is a header (two int64: its kind
and the length of its description), a JSON description and the raw bytes of its tensors
(every dtype travels as bytes, ``bool`` included); tensors of a TensorDict are described by
their key, dtype and shape. Every send and receive waits at most the channel's timeout.

Examples
--------
>>> import threading
>>> from datetime import timedelta
>>> from torch.distributed import PrefixStore, TCPStore
>>> store = TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=10), wait_for_workers=False)
>>> got = []
>>> def actor_side():
...     channel = Channel.join(PrefixStore("c0", store), rank=0, timeout=10.0)
...     got.append(channel.receive())
>>> thread = threading.Thread(target=actor_side)
>>> thread.start()
>>> channel = Channel.join(PrefixStore("c0", TCPStore("127.0.0.1", store.port, None, False,
...                        timedelta(seconds=10))), rank=1, timeout=10.0)
>>> channel.send({"op": "stats"}, [torch.tensor([True, False])])
>>> thread.join()
>>> got[0][0], got[0][1][0].tolist()
({'op': 'stats'}, [True, False])
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

__all__ = ["ERROR", "MESSAGE", "Channel", "ChannelClosedError", "describe", "error_of",
           "tensordict_of"]

#: header kinds
MESSAGE, ERROR = 0, 1
#: the errors a reply can carry by name (anything else arrives as a RuntimeError)
_ERRORS: dict[str, type[Exception]] = {
    cls.__name__: cls for cls in (ValueError, KeyError, TypeError, IndexError, RuntimeError)}
_DTYPES = {str(dtype): dtype for dtype in (
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
    torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128)}


class ChannelClosedError(RuntimeError):
    """The other end left, or a send or receive waited longer than the channel's timeout."""


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)


def describe(td: TensorDictBase) -> tuple[list[list[Any]], list[torch.Tensor]]:
    """``([[key path, dtype, shape], ...], tensors)`` of the leaves of ``td``, in one order."""
    entries, tensors = [], []
    for key, value in td.items(include_nested=True, leaves_only=True):
        if not isinstance(value, torch.Tensor) or str(value.dtype) not in _DTYPES:
            raise TypeError(f"the distributed transport carries tensors of the usual dtypes; "
                            f"entry {key!r} is a {type(value).__name__}.")
        path = list(key) if isinstance(key, tuple) else [key]
        entries.append([path, str(value.dtype), list(value.shape)])
        tensors.append(value)
    return entries, tensors


def tensordict_of(entries: list[list[Any]], tensors: list[torch.Tensor],
                  batch_size: list[int]) -> TensorDict:
    """The TensorDict :func:`describe` described."""
    td = TensorDict({}, batch_size=batch_size)
    for (path, _, _), tensor in zip(entries, tensors):
        td.set(tuple(path), tensor)
    return td


def error_of(description: dict[str, Any]) -> Exception:
    """The exception a reply of kind :data:`ERROR` describes."""
    cls = _ERRORS.get(description.get("type", ""), RuntimeError)
    message = str(description.get("message", ""))
    if cls is RuntimeError and description.get("type") != "RuntimeError":
        message = f"{description.get('type')}: {message}"
    return cls(message)


class Channel:
    """One end of a two-rank gloo process group (see the module docstring)."""

    def __init__(self, group: Any, rank: int, timeout: float) -> None:
        self._group = group
        self._peer = 1 - rank
        self.timeout = timeout

    @classmethod
    def join(cls, store: Any, *, rank: int, timeout: float) -> Channel:
        """The channel of ``rank`` (0 or 1) over ``store``; waits for the other rank (at most
        ``timeout`` s)."""
        from torch.distributed import ProcessGroupGloo

        group = ProcessGroupGloo(store, rank, 2, timedelta(seconds=timeout))
        return cls(group, rank, timeout)

    @classmethod
    def connect(cls, where: dict[str, Any], timeout: float) -> Channel:
        """The client's end (rank 1) of the channel a :class:`~._channel_host.ChannelHost`
        opened at ``where`` (its ``host``, ``port`` and ``prefix``)."""
        from torch.distributed import PrefixStore, TCPStore

        store = TCPStore(where["host"], where["port"], None, False, timedelta(seconds=timeout))
        return cls.join(PrefixStore(where["prefix"], store), rank=1, timeout=timeout)

    def _transfer(self, start: Callable[[], Any], seconds: float | None = None) -> None:
        """Start a send or receive and wait for it; any failure (a timeout, which also closes
        the connection, or a peer gone) is a :class:`ChannelClosedError`."""
        try:
            start().wait(timedelta(seconds=self.timeout if seconds is None else seconds))
        except RuntimeError as err:
            raise ChannelClosedError(f"the distributed transport's channel failed: {err}") \
                from err

    def _send_raw(self, tensor: torch.Tensor) -> None:
        if tensor.numel():
            self._transfer(lambda: self._group.send([tensor], self._peer, 0))

    def _receive_raw(self, numel: int, dtype: torch.dtype = torch.uint8,
                     seconds: float | None = None) -> torch.Tensor:
        out = torch.empty(numel, dtype=dtype)
        if numel:
            self._transfer(lambda: self._group.recv([out], self._peer, 0), seconds)
        return out

    def send(self, description: dict[str, Any], tensors: list[torch.Tensor] = (),  # type: ignore[assignment]
             kind: int = MESSAGE) -> None:
        """Send ``description`` (JSON-able) and ``tensors`` (their dtypes and shapes go in
        the description, under ``"tensors"``)."""
        raw = [_as_bytes(t) for t in tensors]
        description = {**description,
                       "tensors": [[str(t.dtype), list(t.shape)] for t in tensors]}
        text = torch.frombuffer(bytearray(json.dumps(description).encode()), dtype=torch.uint8)
        self._send_raw(torch.tensor([kind, text.numel()], dtype=torch.int64))
        self._send_raw(text)
        for tensor in raw:
            self._send_raw(tensor)

    def receive(self, first_wait: float | None = None
                ) -> tuple[dict[str, Any], list[torch.Tensor], int]:
        """``(description, tensors, kind)`` of the next message; its start may take
        ``first_wait`` s (default: the channel's timeout, as every other part of it)."""
        kind, length = self._receive_raw(2, torch.int64, first_wait).tolist()
        description = json.loads(bytes(self._receive_raw(length).numpy()).decode())
        tensors = []
        for dtype_name, shape in description.pop("tensors"):
            dtype = _DTYPES[dtype_name]
            numel = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
            tensors.append(self._receive_raw(numel).view(dtype).reshape(shape))
        return description, tensors, kind

    def send_error(self, err: BaseException) -> None:
        self.send({"type": type(err).__name__, "message": str(err)}, kind=ERROR)
