"""``rb.client()``: a handle on a served buffer for Ray workers, without its lifecycle.

TorchRL's ``RayReplayBuffer.client()``: what a collector or learner is handed. It writes,
samples, iterates, reports ``stats()``, ... as the buffer does, and pickles (to Ray tasks and
actors), but has no ``close`` / ``shutdown`` / ``respawn``: the buffer that created the actors
keeps their lifecycle.
"""

from __future__ import annotations

import functools
import pickle
from collections.abc import Iterator
from typing import Any

from .transport import DistributedBufferClient

__all__ = ["ClientHandleMixin", "RayBufferClient"]

#: what a handle lacks: the owner's lifecycle of the actors
LIFECYCLE = frozenset({"close", "shutdown", "respawn", "client", "clients"})


class RayBufferClient:
    """A handle on a served buffer (see :meth:`ClientHandleMixin.client`).

    Every public method and property of the buffer is there (``extend``, ``add``,
    ``sample``, ``stats``, ``update_priority``, ``len``, iteration, ``rb[i]``, ...) except
    ``close``, ``shutdown``, ``respawn``, ``client`` and ``clients``. It holds its own client
    of the actors (its own ``prefetch`` queue; an attached client's view, without the creation
    arguments), so using it never changes the owner's connection.
    """

    def __init__(self, buffer: Any) -> None:
        self._buffer = buffer

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name in LIFECYCLE:
            raise AttributeError(f"{type(self).__name__} has no {name!r} (the buffer that "
                                 "created the actors keeps their lifecycle).")
        value = getattr(self._buffer, name)
        if not callable(value):
            return value

        @functools.wraps(value)
        def call(*args: Any, **kwargs: Any) -> Any:
            # a method that returns the buffer (set_, share, append_transform, ...) returns
            # this handle: the buffer has the lifecycle the handle must not give
            result = value(*args, **kwargs)
            return self if result is self._buffer else result

        return call

    def __len__(self) -> int:
        return len(self._buffer)

    def __getitem__(self, index: Any) -> Any:
        return self._buffer[index]

    def __setitem__(self, index: Any, value: Any) -> None:
        self._buffer[index] = value

    def __iter__(self) -> Iterator[Any]:
        return iter(self._buffer)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._buffer!r})"


class ClientHandleMixin:
    """``client()`` / ``clients(n)`` of ``RayReplayBuffer`` and ``ShardedReplayBuffer``."""

    def client(self) -> RayBufferClient | DistributedBufferClient:
        """A handle to send to Ray workers: the buffer's calls without its lifecycle.

        Examples
        --------
        >>> from functools import partial
        >>> import ray
        >>> from tdreplay.core import ListStorage
        >>> from tdreplay.distributed import RayReplayBuffer
        >>> rb = RayReplayBuffer(storage=partial(ListStorage, 10))
        >>> client = rb.client()
        >>> hasattr(client, "close"), hasattr(client, "shutdown")
        (False, False)
        >>> @ray.remote
        ... def collect(buffer):
        ...     return buffer.extend([1, 2, 3]).tolist()
        >>> ray.get(collect.remote(client)), len(rb), client.stats()["write_count"]
        ([0, 1, 2], 3, 3)
        >>> rb.close()
        """
        buffer: Any = self  # the RayReplayBuffer or ShardedReplayBuffer this is mixed into
        if buffer.closed:
            raise RuntimeError(f"{type(self).__name__} is closed.")
        # a copy as a Ray worker receives: the same actors, no lease, no creation arguments
        return self._handle_on(pickle.loads(pickle.dumps(self)))

    def _handle_on(self, copy: Any) -> RayBufferClient | DistributedBufferClient:
        """The handle :meth:`client` gives on ``copy`` (a copy of this buffer's client side):
        its calls through Ray (a transport may give another kind, see ``TransportMixin``)."""
        return RayBufferClient(copy)

    def clients(self, num_clients: int) -> list[RayBufferClient | DistributedBufferClient]:
        """``num_clients`` handles (:meth:`client`), one per concurrent consumer, each with
        its own connection.

        Examples
        --------
        >>> from functools import partial
        >>> from tdreplay.core import ListStorage
        >>> from tdreplay.distributed import RayReplayBuffer
        >>> rb = RayReplayBuffer(storage=partial(ListStorage, 10))
        >>> first, second = rb.clients(2)
        >>> first is not second, len(first)
        (True, 0)
        >>> rb.close()
        """
        if isinstance(num_clients, bool) or not isinstance(num_clients, int):
            raise TypeError(f"num_clients must be an int, got {type(num_clients).__name__}.")
        if num_clients < 1:
            raise ValueError(f"num_clients must be at least 1, got {num_clients}.")
        return [self.client() for _ in range(num_clients)]
