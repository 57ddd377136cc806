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

import importlib
import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from .errors import RemoteBufferError

__all__ = ["ERROR", "MESSAGE", "Channel", "ChannelClosedError", "describe", "error_description",
           "error_of", "tensordict_of"]

#: header kinds
MESSAGE, ERROR = 0, 1
#: the built-in errors a reply can carry by name: the error's own class when it is one of
#: tdreplay's (rebuilt from its module and name), else the first of these it derives from
#: (anything else arrives as a RuntimeError)
_ERRORS: dict[str, type[Exception]] = {
    cls.__name__: cls for cls in (
        FileNotFoundError, TimeoutError, NotImplementedError, KeyError, IndexError,
        LookupError, OSError, TypeError, ValueError, AttributeError, RuntimeError)}
_DTYPES = {str(dtype): dtype for dtype in (
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
    torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128)}


class ChannelClosedError(RemoteBufferError):
    """The other end left, or a send or receive waited longer than the channel's timeout (a
    :class:`~tdreplay.distributed.RemoteBufferError`, as every failure of a remote call)."""

    def __init__(self, message: str, *, actor: str = "the distributed transport's peer") -> None:
        super().__init__(message, actor=actor)


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


def error_description(err: BaseException) -> dict[str, Any]:
    """What a reply of kind :data:`ERROR` says of ``err``: its class (module and name), the
    built-in errors it derives from, and its message."""
    return {"type": type(err).__name__, "module": type(err).__module__,
            "bases": [cls.__name__ for cls in type(err).__mro__ if cls.__name__ in _ERRORS
                      and cls.__module__ == "builtins"],
            # (a KeyError's str quotes its message: its argument travels as it is)
            "message": err.args[0] if len(err.args) == 1 and isinstance(err.args[0], str)
            else str(err)}


def error_of(description: dict[str, Any]) -> Exception:
    """The exception a reply of kind :data:`ERROR` describes: of its own class when that is
    one of tdreplay's that takes a message, else of the first built-in error it derives from
    (its class named in the message), as :func:`error_description` described it.

    Examples
    --------
    >>> from tdreplay.core.utils import ShapeMismatchError
    >>> err = error_of(error_description(ShapeMismatchError("entry 'obs' has shape (2, 4)")))
    >>> type(err).__name__, isinstance(err, ValueError)
    ('ShapeMismatchError', True)
    >>> class Custom(KeyError): pass
    >>> err = error_of(error_description(Custom("x")))
    >>> type(err).__name__, err.args[0]
    ('KeyError', 'Custom: x')
    """
    name = str(description.get("type", ""))
    message = str(description.get("message", ""))
    own = _tdreplay_error(str(description.get("module", "")), name)
    if own is not None:
        try:
            return own(message)
        except TypeError:  # (an error class whose constructor takes more)
            pass
    bases = [base for base in description.get("bases", [name]) if base in _ERRORS]
    cls = _ERRORS[bases[0]] if bases else RuntimeError
    if cls.__name__ != name:
        message = f"{name}: {message}"
    return cls(message)


def _tdreplay_error(module: str, name: str) -> type[Exception] | None:
    """The exception class ``name`` of ``module`` when it is one of tdreplay's modules
    (nothing else is imported on a peer's word)."""
    if not (module == "tdreplay" or module.startswith("tdreplay.")):
        return None
    try:
        cls = getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None
    return cls if isinstance(cls, type) and issubclass(cls, Exception) else None


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
        self.send(error_description(err), kind=ERROR)
